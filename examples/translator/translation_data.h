#pragma once
// The translator's data, between sentence pairs and tensors: tokens, the two
// vocabularies, the fixed train / valid / test split, length buckets and the
// batches drawn from them, and detokenised output for BLEU. Plain C++ (no
// LibTorch).

#include "examples/translator/parallel_corpus.h"
#include "examples/common/text_corpus.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace conveyor::examples {

// Token ids the model sees: four reserved ids, then the vocabulary's words
// (a Vocabulary's own id 0 is <unk>, which becomes kUnkId).
inline constexpr int64_t kPadId = 0;  // padding: never attended to, never in the loss
inline constexpr int64_t kBosId = 1;  // starts every decoder input
inline constexpr int64_t kEosId = 2;  // ends every target
inline constexpr int64_t kUnkId = 3;  // a word outside the vocabulary
inline constexpr int64_t kReservedIds = 3;  // model id = vocabulary id + kReservedIds

// Lower-cases, accented capitals too ("DESPUÉS" -> "después"), sets the
// Spanish opening marks ¿ and ¡ apart, then tokenize() (text_corpus.h): words
// and punctuation.
std::vector<std::string> translation_tokens(std::string_view text);

// Tokens back to text: spaces between them, none before , . ; : ! ? ) and
// none after ( ¿ ¡.
std::string detokenize(const std::vector<std::string>& tokens);

// A pair as model ids (no <bos>, no <eos>).
struct EncodedPair {
  std::vector<int64_t> source, target;
};

struct TranslationDataOptions {
  int64_t max_tokens = 25;       // pairs with a longer side are left out
  int64_t source_vocab = 6000;   // words of each vocabulary, <unk> included
  int64_t target_vocab = 6000;
  int64_t max_train_pairs = 0;   // keep the first N train pairs (0: all)
  uint64_t split_seed = 0;       // the split's hash seed
};

// The corpus cut into train / valid / test by split_of(reference, seed)
// (text_corpus.h: a hash of the reference, about 90 / 5 / 5, fixed whatever
// the order or the other pairs), filtered by length, with both vocabularies
// built from the train split. Index 0, 1, 2 of the arrays: train, valid, test.
struct TranslationData {
  Vocabulary source_vocab, target_vocab;
  std::vector<SentencePair> pairs[3];
  std::vector<EncodedPair> encoded[3];
  int64_t too_long = 0;  // pairs left out for their length
};

// Throws std::invalid_argument when no train, valid or test pair is left.
TranslationData prepare_translation_data(const std::vector<SentencePair>& pairs,
                                         const TranslationDataOptions& options);

// Model ids back to words, stopping at the first kEosId and skipping kPadId
// and kBosId.
std::vector<std::string> decode_ids(const Vocabulary& vocab, const std::vector<int64_t>& ids);

// Bucketing: bucket b holds the pairs whose longer side, with its <eos>, has
// at most bounds[b] tokens and more than bounds[b - 1]; `bounds` ascending,
// the last at least every pair's length. Every batch holds `batch` pairs of
// one bucket (a bucket's remainder is a smaller batch, dropped when under
// `min_batch`). With shuffle, pairs within buckets and batches among them are
// shuffled by `seed` (a new seed each epoch); without, batches keep the
// pairs' order (evaluation).
std::vector<std::vector<int64_t>> bucket_batches(const std::vector<EncodedPair>& pairs,
                                                 const std::vector<int64_t>& bounds, int64_t batch, int64_t min_batch,
                                                 bool shuffle, uint64_t seed);

// Bounds every `width` tokens, the last max_tokens + 1 (room for <eos>); a
// bound closer than width / 2 below the last merges into it: width 5,
// max 25 -> {5, 10, 15, 20, 26}.
std::vector<int64_t> bucket_bounds(int64_t width, int64_t max_tokens);

}  // namespace conveyor::examples
