#include "examples/translator/translation_data.h"

#include <algorithm>
#include <random>
#include <stdexcept>

namespace conveyor::examples {

namespace {

// UTF-8 for U+00C0..U+00DE (À..Þ, less ×) is 0xC3 0x80..0x9E; the lower-case
// letter is 0x20 further on.
std::string lower_case(std::string_view text) {
  std::string out(text);
  for (size_t i = 0; i + 1 < out.size(); ++i) {
    const auto lead = static_cast<unsigned char>(out[i]), next = static_cast<unsigned char>(out[i + 1]);
    if (lead == 0xC3 && next >= 0x80 && next <= 0x9E && next != 0x97) out[i + 1] = static_cast<char>(next + 0x20);
  }
  return out;  // tokenize() lower-cases ASCII
}

bool is_one_of(std::string_view token, std::initializer_list<std::string_view> marks) {
  return std::any_of(marks.begin(), marks.end(), [&](std::string_view m) { return token == m; });
}

constexpr std::string_view kInvertedQuestion = "\xC2\xBF", kInvertedExclamation = "\xC2\xA1";

std::vector<int64_t> encode_side(const Vocabulary& vocab, const std::vector<std::string>& tokens) {
  std::vector<int64_t> ids = vocab.encode(tokens);
  for (auto& id : ids) id += kReservedIds;
  return ids;
}

}  // namespace

std::vector<std::string> translation_tokens(std::string_view text) {
  std::string spaced;
  spaced.reserve(text.size() + 8);
  for (size_t i = 0; i < text.size(); ++i) {
    const std::string_view rest = text.substr(i);
    if (rest.starts_with(kInvertedQuestion) || rest.starts_with(kInvertedExclamation)) {
      spaced += ' ';
      spaced += rest.substr(0, 2);
      spaced += ' ';
      ++i;
    } else {
      spaced += text[i];
    }
  }
  return tokenize(lower_case(spaced));
}

std::string detokenize(const std::vector<std::string>& tokens) {
  std::string out;
  bool glue_next = true;  // no space before the first token
  for (const auto& t : tokens) {
    const bool closes = t == "," || t == "." || t == ";" || t == ":" || t == "!" || t == "?" || t == ")" ||
                        (t.size() > 1 && t.find_first_not_of(t[0]) == std::string::npos &&
                         (t[0] == '.' || t[0] == '!' || t[0] == '?'));
    if (!glue_next && !closes) out += ' ';
    out += t;
    glue_next = is_one_of(t, {"(", kInvertedQuestion, kInvertedExclamation});
  }
  return out;
}

TranslationData prepare_translation_data(const std::vector<SentencePair>& pairs,
                                         const TranslationDataOptions& options) {
  TranslationData data;
  std::vector<std::vector<std::string>> tokens[3][2];
  for (const auto& pair : pairs) {
    auto source = translation_tokens(pair.source), target = translation_tokens(pair.target);
    if (source.empty() || target.empty()) continue;
    if (static_cast<int64_t>(std::max(source.size(), target.size())) > options.max_tokens) {
      ++data.too_long;
      continue;
    }
    const int split = static_cast<int>(split_of(pair.reference, options.split_seed));
    if (split == 0 && options.max_train_pairs > 0 &&
        static_cast<int64_t>(data.pairs[0].size()) >= options.max_train_pairs) {
      continue;
    }
    data.pairs[split].push_back(pair);
    tokens[split][0].push_back(std::move(source));
    tokens[split][1].push_back(std::move(target));
  }
  const char* names[3] = {"train", "valid", "test"};
  for (int s = 0; s < 3; ++s) {
    if (data.pairs[s].empty()) {
      throw std::invalid_argument(std::string("no ") + names[s] + " pair is left of " + std::to_string(pairs.size()) +
                                  " pairs with at most " + std::to_string(options.max_tokens) + " tokens a side");
    }
  }
  std::vector<std::string> all[2];
  for (int side = 0; side < 2; ++side) {
    for (const auto& sentence : tokens[0][side]) all[side].insert(all[side].end(), sentence.begin(), sentence.end());
  }
  data.source_vocab = Vocabulary::build(all[0], options.source_vocab);
  data.target_vocab = Vocabulary::build(all[1], options.target_vocab);
  for (int s = 0; s < 3; ++s) {
    for (size_t i = 0; i < data.pairs[s].size(); ++i) {
      data.encoded[s].push_back(
          {encode_side(data.source_vocab, tokens[s][0][i]), encode_side(data.target_vocab, tokens[s][1][i])});
    }
  }
  return data;
}

std::vector<std::string> decode_ids(const Vocabulary& vocab, const std::vector<int64_t>& ids) {
  std::vector<std::string> words;
  for (const int64_t id : ids) {
    if (id == kEosId) break;
    if (id == kPadId || id == kBosId) continue;
    words.push_back(vocab.word(id - kReservedIds));
  }
  return words;
}

std::vector<std::vector<int64_t>> bucket_batches(const std::vector<EncodedPair>& pairs,
                                                 const std::vector<int64_t>& bounds, int64_t batch, int64_t min_batch,
                                                 bool shuffle, uint64_t seed) {
  if (bounds.empty() || !std::is_sorted(bounds.begin(), bounds.end()) || batch < 1) {
    throw std::invalid_argument("bucket_batches: bounds must be ascending and non-empty, and batch positive");
  }
  std::vector<std::vector<int64_t>> buckets(bounds.size());
  for (size_t i = 0; i < pairs.size(); ++i) {
    const auto length = static_cast<int64_t>(std::max(pairs[i].source.size(), pairs[i].target.size()) + 1);
    const auto it = std::lower_bound(bounds.begin(), bounds.end(), length);
    if (it == bounds.end()) {
      throw std::invalid_argument("bucket_batches: pair " + std::to_string(i) + " has " + std::to_string(length) +
                                  " tokens with <eos>, more than the last bucket bound " +
                                  std::to_string(bounds.back()));
    }
    buckets[it - bounds.begin()].push_back(static_cast<int64_t>(i));
  }
  std::mt19937_64 random(seed);
  std::vector<std::vector<int64_t>> batches;
  for (auto& bucket : buckets) {
    if (shuffle) std::shuffle(bucket.begin(), bucket.end(), random);
    for (size_t start = 0; start < bucket.size(); start += static_cast<size_t>(batch)) {
      const size_t end = std::min(bucket.size(), start + static_cast<size_t>(batch));
      if (static_cast<int64_t>(end - start) < min_batch) continue;
      batches.emplace_back(bucket.begin() + static_cast<std::ptrdiff_t>(start),
                           bucket.begin() + static_cast<std::ptrdiff_t>(end));
    }
  }
  if (shuffle) std::shuffle(batches.begin(), batches.end(), random);
  return batches;
}

std::vector<int64_t> bucket_bounds(int64_t width, int64_t max_tokens) {
  if (width < 1 || max_tokens < 1) throw std::invalid_argument("bucket_bounds: width and max_tokens must be positive");
  const int64_t last = max_tokens + 1;
  std::vector<int64_t> bounds;
  for (int64_t b = width; b < last; b += width) {
    if (2 * (last - b) >= width) bounds.push_back(b);
  }
  bounds.push_back(last);
  return bounds;
}

}  // namespace conveyor::examples
