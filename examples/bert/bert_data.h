#pragma once
// The BERT example's data: fortunes cut into sequences of subword pieces,
// [CLS] pieces [SEP], and masked-language-model batches made from them with
// BERT's masking (15% of the words or pieces chosen; of those 80% read [MASK],
// 10% a random piece, 10% stay) and a padding mask.

#include "examples/bert/bert_tokenizer.h"
#include "examples/common/text_corpus.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace conveyor::examples {

using Sequences = std::vector<std::vector<int64_t>>;

struct MlmData {
  std::string source;  // what was read
  SubwordTokenizer tokenizer;
  bool trained_tokenizer = false;  // false: the cached model was reused
  Sequences train, valid, test;
  int64_t train_pieces = 0, valid_pieces = 0;  // without [CLS] and [SEP]
  UnigramBaseline valid_unigram;               // of the pieces, from the train split's counts
};

struct MlmDataOptions {
  std::string fortune_dir = "/usr/share/games/fortunes";
  std::string tokenizer_model;  // a model to load; empty: train (or reuse) one in tokenizer_dir
  std::string tokenizer_dir;
  int64_t vocab = 2000;
  int64_t seq_len = 64;  // pieces per sequence, [CLS] and [SEP] included; longer fortunes make several
  uint64_t split_seed = 0;
};

// Reads the fortunes, splits them (about 90/5/5 by a hash of each), trains
// or loads the tokenizer on the train split and cuts every fortune into
// sequences. Throws std::runtime_error naming the folder or model at fault,
// std::invalid_argument when seq_len < 3.
MlmData load_mlm_data(const MlmDataOptions& options);

struct Masking {
  double probability = 0.15;
  bool whole_word = true;  // choose words (a piece starting with a space and those after it) rather than pieces
};

// A batch of sequences `which` of `seqs`, padded to the longest of them:
// tokens [N, L] (long), padding [N, L] (bool, true = a pad to ignore),
// labels [N, L] (long: the original piece where a prediction is asked for,
// kIgnore elsewhere). Every sequence gets at least one prediction. The
// choice depends only on `seed` and the sequence's index, not on the batch.
struct MlmBatch {
  at::Tensor tokens, padding, labels;
  int64_t predictions = 0;
};
inline constexpr int64_t kIgnore = -100;
MlmBatch make_mlm_batch(const Sequences& seqs, const std::vector<int64_t>& which, const SubwordTokenizer& tokenizer,
                        const Masking& masking, uint64_t seed);

}  // namespace conveyor::examples
