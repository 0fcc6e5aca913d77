// The language-model example's data code: tokeniser, vocabulary, split,
// windows, unigram baseline, file readers and progress line.

#include "examples/common/progress.h"
#include "error_of.h"
#include "examples/common/text_corpus.h"
#include "temp_dir.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace conveyor::examples {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using conveyor::testing::error_of;

TEST(Tokenize, LowerCasesAndSplitsPunctuation) {
  EXPECT_THAT(tokenize("Hello, World!  Don't PANIC...\n42 A-b\tend"),
              ElementsAre("hello", ",", "world", "!", "don't", "panic", "...", "42", "a", "-", "b", "end"));
}

TEST(Tokenize, ApostrophesOnlyInsideWordsAndRunsOfOnePunctuationCharacter) {
  EXPECT_THAT(tokenize("dogs' 'tis --x !!!?"), ElementsAre("dogs", "'", "'", "tis", "--", "x", "!!!", "?"));
  EXPECT_THAT(tokenize("Caf\xc3\xa9 ok"), ElementsAre("caf\xc3\xa9", "ok"));  // UTF-8 bytes stay in the word
  EXPECT_TRUE(tokenize(" \n\t ").empty());
}

TEST(SplitFortunes, PercentLinesSeparateEntries) {
  const std::string text = "one\n%\ntwo\nlines\n% \r\n  \n%\nthree 50%\n%%\nstill three\n%\n";
  EXPECT_THAT(split_fortunes(text), ElementsAre("one\n", "two\nlines\n", "three 50%\n%%\nstill three\n"));
  EXPECT_THAT(split_fortunes("no separator at the end"), ElementsAre("no separator at the end\n"));
}

TEST(Vocabulary, RanksByFrequencyThenSpellingAndMapsTheRestToUnk) {
  const std::vector<std::string> tokens = {"b", "b", "a", "a", "c", "d", "d", "d", "<unk>", "<unk>", "<unk>", "<unk>"};
  const Vocabulary full = Vocabulary::build(tokens, 100);
  ASSERT_EQ(full.size(), 5);
  EXPECT_EQ(full.word(0), "<unk>");
  EXPECT_EQ(full.word(1), "d");
  EXPECT_EQ(full.word(2), "a");  // a and b tie at 2: alphabetical
  EXPECT_EQ(full.word(3), "b");
  EXPECT_EQ(full.word(4), "c");

  const Vocabulary capped = Vocabulary::build(tokens, 3);
  ASSERT_EQ(capped.size(), 3);
  EXPECT_EQ(capped.id("d"), 1);
  EXPECT_EQ(capped.id("a"), 2);
  EXPECT_EQ(capped.id("b"), 0);
  EXPECT_EQ(capped.id("never seen"), 0);
  EXPECT_THAT(capped.encode({"c", "a", "d", "<unk>"}), ElementsAre(0, 2, 1, 0));
  EXPECT_THROW(capped.word(3), std::out_of_range);
  EXPECT_THAT(error_of([&] { Vocabulary::build(tokens, 1); }), HasSubstr("at least 2"));
}

TEST(Vocabulary, DoesNotDependOnTheOrderOfTheText) {
  std::vector<std::string> tokens = {"x", "y", "z", "y", "x", "w"};
  const Vocabulary a = Vocabulary::build(tokens, 10);
  std::reverse(tokens.begin(), tokens.end());
  const Vocabulary b = Vocabulary::build(tokens, 10);
  ASSERT_EQ(a.size(), b.size());
  for (int64_t i = 0; i < a.size(); ++i) EXPECT_EQ(a.word(i), b.word(i)) << "id " << i;
}

TEST(Split, IsDeterministicAndRoughlyNinetyFiveFive) {
  int counts[3] = {0, 0, 0};
  int moved_by_seed = 0;
  for (int i = 0; i < 4000; ++i) {
    const std::string entry = "entry number " + std::to_string(i);
    const Split s = split_of(entry, 7);
    EXPECT_EQ(split_of(entry, 7), s);
    ++counts[static_cast<int>(s)];
    moved_by_seed += split_of(entry, 8) != s;
  }
  EXPECT_NEAR(counts[0] / 4000.0, 0.90, 0.02);
  EXPECT_NEAR(counts[1] / 4000.0, 0.05, 0.015);
  EXPECT_NEAR(counts[2] / 4000.0, 0.05, 0.015);
  EXPECT_GT(moved_by_seed, 100);
}

// The words of the entries one split holds, each entry being one word.
std::set<std::string> words_of(const Corpus& c, const std::vector<int64_t>& ids) {
  std::set<std::string> words;
  for (int64_t id : ids) {
    if (c.vocab.word(id) != kEos) words.insert(c.vocab.word(id));
  }
  return words;
}

TEST(LoadFortunes, SplitIsDisjointAndIndependentOfFileOrder) {
  const int n = 300;
  TempDir forward, backward;
  std::string first, second, reversed;
  for (int i = 0; i < n; ++i) (i < n / 2 ? first : second) += "w" + std::to_string(i) + "\n%\n";
  for (int i = n - 1; i >= 0; --i) reversed += "w" + std::to_string(i) + "\n%\n";
  forward.write("alpha", first);
  forward.write("beta", second);
  forward.write("alpha.dat", "datfile\n%\n");  // skipped: index, link, subdirectory
  fs::create_symlink(forward.path() / "alpha", forward.path() / "alpha.u8");
  fs::create_directories(forward.path() / "off");
  std::ofstream(forward.path() / "off" / "rude") << "offensive\n%\n";
  backward.write("only", reversed);

  const Corpus a = load_fortunes(forward.str(), 1000, 42);
  const Corpus b = load_fortunes(backward.str(), 1000, 42);
  EXPECT_THAT(a.source, HasSubstr("2 fortune files"));
  EXPECT_EQ(a.train_entries + a.valid_entries + a.test_entries, n);
  EXPECT_EQ(a.train_entries, static_cast<int64_t>(a.train.size()) / 2);  // one word and <eos> each
  EXPECT_GT(a.valid_entries, 0);
  EXPECT_GT(a.test_entries, 0);

  const auto train = words_of(a, a.train);
  std::set<std::string> valid, test;
  for (int i = 0; i < n; ++i) {  // valid and test words are outside the train vocabulary: find them by split
    const std::string w = "w" + std::to_string(i);
    const Split s = split_of(w + "\n", 42);
    if (s == Split::kValid) valid.insert(w);
    if (s == Split::kTest) test.insert(w);
    EXPECT_EQ(train.count(w), s == Split::kTrain ? 1u : 0u) << w;
  }
  EXPECT_EQ(static_cast<int64_t>(valid.size()), a.valid_entries);
  EXPECT_EQ(static_cast<int64_t>(test.size()), a.test_entries);
  EXPECT_EQ(train.size() + valid.size() + test.size(), static_cast<size_t>(n));
  EXPECT_EQ(a.vocab.id("datfile"), 0);
  EXPECT_EQ(a.vocab.id("offensive"), 0);

  EXPECT_EQ(words_of(b, b.train), train);
  EXPECT_EQ(b.valid.size(), a.valid.size());
  EXPECT_EQ(b.test.size(), a.test.size());
}

TEST(LoadFortunes, ClearErrors) {
  TempDir dir;
  const std::string missing = dir.str() + "/nowhere";
  EXPECT_THAT(error_of([&] { load_fortunes(missing, 100, 1); }), HasSubstr(missing));
  dir.write("x.dat", "");
  EXPECT_THAT(error_of([&] { load_fortunes(dir.str(), 100, 1); }), HasSubstr("holds no fortune file"));
  dir.write("one", "just one entry\n");
  const std::string message = error_of([&] { load_fortunes(dir.str(), 100, 1); });
  EXPECT_THAT(message, HasSubstr("split of " + dir.str() + " is empty"));
}

TEST(Batchify, RowsAreContiguousStreamsAndTargetsAreShiftedByOne) {
  std::vector<int64_t> stream(23);
  for (int64_t i = 0; i < 23; ++i) stream[i] = i;
  const TokenGrid grid = batchify(stream, 3, "train");
  EXPECT_EQ(grid.rows, 3);
  EXPECT_EQ(grid.cols, 7);            // 23 / 3; the last 2 tokens are dropped
  ASSERT_EQ(grid.num_windows(4), 2);  // 6 targets per row: 4 + 2

  const auto w0 = grid.window(0, 4);
  EXPECT_EQ(w0.len, 4);
  EXPECT_THAT(w0.inputs, ElementsAre(0, 1, 2, 3, 7, 8, 9, 10, 14, 15, 16, 17));
  EXPECT_THAT(w0.targets, ElementsAre(1, 2, 3, 4, 8, 9, 10, 11, 15, 16, 17, 18));
  const auto w1 = grid.window(1, 4);
  EXPECT_EQ(w1.len, 2);
  EXPECT_THAT(w1.inputs, ElementsAre(4, 5, 11, 12, 18, 19));
  EXPECT_THAT(w1.targets, ElementsAre(5, 6, 12, 13, 19, 20));
  EXPECT_EQ(grid.num_windows(6), 1);
  EXPECT_THROW(grid.window(2, 4), std::out_of_range);
  EXPECT_THROW(grid.num_windows(0), std::invalid_argument);
}

TEST(Batchify, RejectsTooFewTokensNamingTheSplit) {
  const std::string message = error_of([] { batchify({1, 2, 3, 4, 5}, 3, "valid"); });
  EXPECT_THAT(message, HasSubstr("valid split has 5 tokens"));
  EXPECT_THROW(batchify({1, 2, 3}, 0, "train"), std::invalid_argument);
}

TEST(UnigramBaseline, MatchesAHandComputedCorpus) {
  // Train counts over V = 4: {1, 2, 1, 0}, N = 4, so with add-one smoothing
  // p = {2/8, 3/8, 2/8, 1/8}.
  const UnigramBaseline b = unigram_baseline({0, 1, 1, 2}, {1, 3}, 4);
  const double entropy = -(2 * 0.25 * std::log(0.25) + 0.375 * std::log(0.375) + 0.125 * std::log(0.125));
  EXPECT_NEAR(b.train_entropy, entropy, 1e-12);
  EXPECT_NEAR(b.cross_entropy, 0.5 * std::log(64.0 / 3.0), 1e-12);
  EXPECT_NEAR(b.perplexity(), std::sqrt(64.0 / 3.0), 1e-12);
  EXPECT_THAT(error_of([] { unigram_baseline({0, 4}, {1}, 4); }), HasSubstr("train split holds id 4"));
  EXPECT_THROW(unigram_baseline({0}, {}, 4), std::invalid_argument);
}

TEST(LoadPtb, ReadsLinesAddsEosAndMapsUnknownWords) {
  TempDir dir;
  dir.write("ptb.train.txt", " the cat sat \n the dog <unk> \n");
  dir.write("ptb.valid.txt", " the cat ran \n");
  dir.write("ptb.test.txt", " a dog \n\n");
  const Corpus c = load_ptb(dir.str(), 10);
  // Counts: the 2, <eos> 2, cat 1, dog 1, sat 1; ties alphabetical ('<' < 't').
  ASSERT_EQ(c.vocab.size(), 6);
  EXPECT_EQ(c.vocab.word(1), "<eos>");
  EXPECT_EQ(c.vocab.word(2), "the");
  EXPECT_THAT(c.train, ElementsAre(2, 3, 5, 1, 2, 4, 0, 1));
  EXPECT_THAT(c.valid, ElementsAre(2, 3, 0, 1));
  EXPECT_THAT(c.test, ElementsAre(0, 4, 1));
  EXPECT_EQ(c.train_entries, 2);
  EXPECT_EQ(c.test_entries, 1);
  EXPECT_EQ(c.distinct_train_words, 6);
}

TEST(LoadPtb, ClearErrorsNameThePath) {
  TempDir dir;
  const std::string missing = dir.str() + "/no_such_dir";
  EXPECT_THAT(error_of([&] { load_ptb(missing, 100); }), HasSubstr(missing));

  dir.write("ptb.train.txt", "a b\n");
  dir.write("ptb.valid.txt", "a\n");
  const std::string test_file = (dir.path() / "ptb.test.txt").string();
  EXPECT_THAT(error_of([&] { load_ptb(dir.str(), 100); }), HasSubstr("'" + test_file + "' is missing"));

  dir.write("ptb.test.txt", "");
  EXPECT_THAT(error_of([&] { load_ptb(dir.str(), 100); }), HasSubstr("'" + test_file + "' is empty"));
  dir.write("ptb.test.txt", " \n\n");
  EXPECT_THAT(error_of([&] { load_ptb(dir.str(), 100); }), HasSubstr("'" + test_file + "' holds no words"));
}

TEST(Progress, FormatsDurationsAndCounts) {
  EXPECT_EQ(format_duration(7.4), "0:07");
  EXPECT_EQ(format_duration(185), "3:05");
  EXPECT_EQ(format_duration(3723), "1:02:03");
  EXPECT_EQ(format_duration(-1), "-:--");
  EXPECT_EQ(format_count(8412.4), "8,412");
  EXPECT_EQ(format_count(999), "999");
  EXPECT_EQ(format_count(1234567), "1,234,567");
  ProgressLine line{.step = 3,
                    .total = 12,
                    .loss = std::log(100.0),
                    .tokens_per_second = 1500,
                    .elapsed_seconds = 30,
                    .eta_seconds = 90};
  EXPECT_EQ(line.str(4), "step  3/12 [=>..]  loss 4.605  ppl 100.0  1,500 tok/s  0:30 elapsed  ETA 1:30");
}

TEST(Progress, PlainLinesEveryNStepsWhenNotATerminal) {
  std::ostringstream out;
  ProgressBar bar(out, 5, /*interactive=*/false, /*every=*/2);
  for (int step = 1; step <= 5; ++step) bar.update(step, step, 100);
  bar.finish();
  std::vector<std::string> lines;
  std::istringstream in(out.str());
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 3u) << out.str();
  EXPECT_THAT(lines[0], HasSubstr("step 2/5  loss 1.500"));
  EXPECT_THAT(lines[1], HasSubstr("step 4/5  loss 3.500"));
  EXPECT_THAT(lines[2], HasSubstr("step 5/5  loss 4.500"));
  EXPECT_EQ(out.str().find('\r'), std::string::npos);
}

TEST(Progress, RedrawsOneLineOnATerminal) {
  std::ostringstream out;
  ProgressBar bar(out, 3, /*interactive=*/true, /*every=*/10);
  bar.update(1, 2.0, 10);
  bar.update(2, 4.0, 10);
  const std::string drawn = out.str();
  EXPECT_EQ(drawn.find('\n'), std::string::npos);
  EXPECT_EQ(std::count(drawn.begin(), drawn.end(), '\r'), 2);
  EXPECT_THAT(drawn, HasSubstr("loss 3.000"));
  bar.note("valid loss 3.1");
  bar.finish();
  EXPECT_THAT(out.str(), HasSubstr("\r\033[Kvalid loss 3.1\n"));
  EXPECT_EQ(out.str().back(), '\n');
}

}  // namespace
}  // namespace conveyor::examples
