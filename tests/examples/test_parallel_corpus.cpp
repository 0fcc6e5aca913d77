// The translator's data code: diatheke's output, verse alignment, parallel
// files, tokens, the split, buckets and detokenising.

#include "error_of.h"
#include "examples/translator/parallel_corpus.h"
#include "examples/translator/translation_data.h"
#include "temp_dir.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace conveyor::examples {
namespace {

using conveyor::testing::error_of;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// As `diatheke -b engKJV2006eb -f plain -k Gen-Rev` prints it: from the
// Psalms on, verses are indented and a psalm's heading follows each verse.
constexpr const char* kDiathekeOutput =
    "Genesis 1:1: In the beginning God created the heaven and the earth.\n"
    "Exodus 6:3: by my name \\nd JEHOVAH was I not known to them.  \n"
    "   Psalms 3:1: \xC2\xB6 LORD, how are they increased that trouble me! \n"
    "\n"
    "A Psalm of David, when he fled from Absalom his son.\n"
    "   I John 2:23: Whosoever denieth the Son, [but] he that acknowledgeth the Son hath the Father also.\n"
    "Numbers 12:16: \n"
    "Revelation of John 22:21: La gracia de nuestro Se\xC3\xB1or Jesucristo <G5547> sea con todos.   \n"
    "(engKJV2006eb)\n";

TEST(Diatheke, ParsesReferencesAndStripsMarkupAndHeadings) {
  const auto verses = parse_diatheke_plain(kDiathekeOutput);
  ASSERT_EQ(verses.size(), 5u);  // the empty Numbers 12:16, the heading and "(module)" are not verses
  EXPECT_EQ(verses[0].reference, "Genesis 1:1");
  EXPECT_EQ(verses[1].text, "by my name JEHOVAH was I not known to them.");
  EXPECT_EQ(verses[2].reference, "Psalms 3:1");
  EXPECT_EQ(verses[2].text, "LORD, how are they increased that trouble me!");
  EXPECT_EQ(verses[3].reference, "I John 2:23");
  EXPECT_EQ(verses[3].text, "Whosoever denieth the Son, but he that acknowledgeth the Son hath the Father also.");
  EXPECT_EQ(verses[4].reference, "Revelation of John 22:21");
  EXPECT_EQ(verses[4].text, "La gracia de nuestro Se\xC3\xB1or Jesucristo sea con todos.");
}

TEST(Diatheke, AlignsByReferenceInTheSourcesOrder) {
  const std::vector<Verse> english = {{"Genesis 1:1", "In the beginning"}, {"Genesis 1:2", "And the earth"},
                                      {"Genesis 1:3", "And God said"}};
  const std::vector<Verse> spanish = {{"Genesis 1:3", "Y dijo Dios"}, {"Genesis 1:1", "En el principio"}};
  const auto pairs = align_by_reference(english, spanish);
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_EQ(pairs[0].reference, "Genesis 1:1");
  EXPECT_EQ(pairs[0].target, "En el principio");
  EXPECT_EQ(pairs[1].source, "And God said");
  EXPECT_EQ(pairs[1].target, "Y dijo Dios");
}

TEST(Diatheke, AMissingModuleOrProgramIsNamed) {
  TempDir dir;
  const std::string message = error_of([&] { read_sword_module("NoSuchModule", dir.str()); });
  EXPECT_THAT(message, HasSubstr("NoSuchModule"));
  EXPECT_THAT(message, ::testing::AnyOf(HasSubstr("not installed"), HasSubstr("diatheke")));
  EXPECT_THAT(error_of([&] { read_sword_module("a; rm -rf x", dir.str()); }), HasSubstr("not a SWORD module name"));
}

TEST(Diatheke, ReadsTheCacheInsteadOfRunningAgain) {
  TempDir dir;
  dir.write("Mine.verses.tsv", "Genesis 1:1\tIn the beginning\nGenesis 1:2\tAnd the earth\n");
  const auto verses = read_sword_module("Mine", dir.str());
  ASSERT_EQ(verses.size(), 2u);
  EXPECT_EQ(verses[1].reference, "Genesis 1:2");
  EXPECT_EQ(verses[1].text, "And the earth");
}

TEST(ParallelFiles, PairsLinesAndSkipsBlankOnes) {
  TempDir dir;
  dir.write("en.txt", "The dog eats.\n\nThe cat  sleeps.\n");
  dir.write("es.txt", "El perro come.\nnada\nEl gato duerme.\n");
  const auto pairs = read_parallel_files((dir.path() / "en.txt").string(), (dir.path() / "es.txt").string());
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_EQ(pairs[1].reference, "line 3");
  EXPECT_EQ(pairs[1].source, "The cat sleeps.");
  EXPECT_EQ(pairs[1].target, "El gato duerme.");
}

TEST(ParallelFiles, ClearErrors) {
  TempDir dir;
  dir.write("en.txt", "one\ntwo\nthree\n");
  dir.write("es.txt", "uno\ndos\n");
  const std::string en = (dir.path() / "en.txt").string(), es = (dir.path() / "es.txt").string();
  const std::string mismatch = error_of([&] { read_parallel_files(en, es); });
  EXPECT_THAT(mismatch, HasSubstr("differ in length"));
  EXPECT_THAT(mismatch, HasSubstr(en + "' has 3 lines"));
  EXPECT_THAT(mismatch, HasSubstr(es + "' has 2"));
  EXPECT_THAT(error_of([&] { read_parallel_files(en, es + ".missing"); }), HasSubstr(es + ".missing' is missing"));
}

TEST(TranslationTokens, LowerCasesAccentedCapitalsAndSetsOpeningMarksApart) {
  EXPECT_THAT(translation_tokens("DESPU\xC3\x89S dijo: \xC2\xBFPor qu\xC3\xA9?"),
              ElementsAre("despu\xC3\xA9s", "dijo", ":", "\xC2\xBF", "por", "qu\xC3\xA9", "?"));
  EXPECT_EQ(detokenize({"\xC2\xBF", "por", "qu\xC3\xA9", "?", "y", ",", "(", "dijo", ")", "..."}),
            "\xC2\xBFpor qu\xC3\xA9? y, (dijo)...");
}

std::vector<SentencePair> numbered_pairs(int count) {
  std::vector<SentencePair> pairs;
  for (int i = 0; i < count; ++i) {
    const std::string n = std::to_string(i % 7);
    pairs.push_back({"Verse " + std::to_string(i), "word" + n + " and more", "palabra" + n + " y m\xC3\xA1s"});
  }
  return pairs;
}

TEST(TranslationData, SplitIsFixedByReferenceAndIdsRoundTrip) {
  auto pairs = numbered_pairs(400);
  TranslationDataOptions options;
  options.split_seed = 14;
  const TranslationData a = prepare_translation_data(pairs, options);
  std::reverse(pairs.begin(), pairs.end());
  const TranslationData b = prepare_translation_data(pairs, options);
  std::set<std::string> test_a, test_b;
  for (const auto& p : a.pairs[2]) test_a.insert(p.reference);
  for (const auto& p : b.pairs[2]) test_b.insert(p.reference);
  EXPECT_EQ(test_a, test_b);
  EXPECT_GT(a.pairs[0].size(), 300u);
  EXPECT_EQ(a.pairs[0].size() + a.pairs[1].size() + a.pairs[2].size(), 400u);
  const auto& first = a.encoded[2][0];
  EXPECT_EQ(detokenize(decode_ids(a.target_vocab, first.target)), a.pairs[2][0].target);
  for (const int64_t id : first.source) EXPECT_GE(id, kReservedIds);
}

TEST(TranslationData, LeavesOutLongPairsAndSaysWhenASplitIsEmpty) {
  auto pairs = numbered_pairs(200);
  pairs[0].target = "uno dos tres cuatro cinco seis";
  TranslationDataOptions options;
  options.max_tokens = 4;
  EXPECT_EQ(prepare_translation_data(pairs, options).too_long, 1);
  options.max_tokens = 1;
  EXPECT_THAT(error_of([&] { prepare_translation_data(pairs, options); }), HasSubstr("at most 1 tokens"));
}

TEST(Buckets, EveryBatchComesFromOneBucketAndEveryPairOnce) {
  std::vector<EncodedPair> pairs;
  for (int i = 0; i < 100; ++i) {
    pairs.push_back({std::vector<int64_t>(1 + i % 12, 5), std::vector<int64_t>(1 + (i * 7) % 12, 6)});
  }
  const std::vector<int64_t> bounds = bucket_bounds(4, 12);
  EXPECT_THAT(bounds, ElementsAre(4, 8, 13));
  const auto batches = bucket_batches(pairs, bounds, 8, 1, true, 3);
  std::multiset<int64_t> seen;
  for (const auto& batch : batches) {
    EXPECT_LE(batch.size(), 8u);
    std::set<size_t> buckets;
    for (const int64_t i : batch) {
      seen.insert(i);
      const auto longer = static_cast<int64_t>(std::max(pairs[i].source.size(), pairs[i].target.size()) + 1);
      buckets.insert(static_cast<size_t>(std::lower_bound(bounds.begin(), bounds.end(), longer) - bounds.begin()));
    }
    EXPECT_EQ(buckets.size(), 1u);
  }
  EXPECT_EQ(seen.size(), 100u);
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 100u);
  EXPECT_NE(bucket_batches(pairs, bounds, 8, 1, true, 4), batches);  // another epoch, another order
  EXPECT_THAT(error_of([&] { bucket_batches(pairs, {4, 8}, 8, 1, false, 0); }), HasSubstr("last bucket bound 8"));
}

}  // namespace
}  // namespace conveyor::examples
