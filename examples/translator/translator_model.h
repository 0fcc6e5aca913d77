#pragma once
// The translator: an LSTM encoder-decoder with attention (Luong-style,
// "general" scores), written as a torch::nn::Sequential of layers of several
// tensors so that a pipeline can cut it between any two layers. What flows
// between layers:
//
//   {source ids [n, S], source mask [n, S], decoder input ids [n, T]}      the model's inputs
//   0  source embedding            -> {source vectors, mask, decoder input}
//   1  dropout
//   2  encoder LSTM 1, 3 encoder LSTM 2  -> {memory [n, S, H], mask, decoder input}
//   4  target embedding, 5 dropout -> {memory, mask, target vectors [n, T, E]}
//   6  decoder LSTM 1, 7 decoder LSTM 2  -> {memory, mask, decoder states [n, T, H]}
//   8  attention over the memory (padding masked out) -> {attentional states [n, T, E]}
//   9  projection to the target vocabulary -> {logits [n, T, V]}
//
// The memory and the mask ride along through the decoder's stages to the
// attention; the mask (bool) travels forward only. The LSTMs run from zero
// states; padding follows every sentence, so it never changes a real
// position's state. The projection may share the target embedding's weight
// (tied): its input width is the embedding's for that reason.

#include "examples/translator/translation_data.h"
#include "ops/adapters.h"

#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <string>
#include <vector>

namespace conveyor::examples {

struct TranslatorShape {
  int64_t source_vocab = 0, target_vocab = 0;  // model ids, reserved ids included
  int64_t embed = 128, hidden = 256;
  double dropout = 0.1;
};

struct Translator {
  torch::nn::Sequential layers;
  std::vector<std::string> names;  // one per layer, for the plan
  std::vector<double> costs;       // rough multiply-adds per token, for balancing the stages
  // The parameter names of the target embedding and the projection's weight,
  // for PipelineOptions::tied_parameters.
  std::vector<std::string> tie;
};

Translator make_translator(const TranslatorShape& shape);

// A batch of pairs as the model's inputs {source, mask, decoder input} and
// its target {decoder output}: decoder input = <bos> y1 .. yn, output = y1 ..
// yn <eos>, each side padded with kPadId to its own longest sentence.
struct TranslationBatch {
  Tensors inputs, targets;
  int64_t sentences = 0, target_tokens = 0;  // tokens in the loss (<eos> included)
};
TranslationBatch make_batch(const std::vector<EncodedPair>& pairs, const std::vector<int64_t>& indices);

// The batch `indices` as `parts` micro-batches of consecutive pairs (sizes
// differing by at most one), each padded to its own longest sentence.
std::vector<TranslationBatch> make_microbatches(const std::vector<EncodedPair>& pairs,
                                                const std::vector<int64_t>& indices, int64_t parts);

// Runs layers [begin, end) of the model on `values`, in the caller's thread.
Tensors forward_layers(const torch::nn::Sequential& layers, size_t begin, size_t end, Tensors values);

// Mean cross-entropy over the target tokens that are not padding.
at::Tensor translation_loss(const Tensors& outputs, const Tensors& targets);

// Greedy decoding with the whole model on one device: the encoder runs once,
// then the decoder layers (4 to the end) run on the growing prefix, taking
// the most likely next word until every sentence has ended or max_length
// words are out. Returns each sentence's ids (up to its <eos>, exclusive).
std::vector<std::vector<int64_t>> greedy_translate(const torch::nn::Sequential& layers,
                                                   const std::vector<EncodedPair>& pairs,
                                                   const std::vector<int64_t>& indices, int64_t max_length);

}  // namespace conveyor::examples
