#pragma once
// The BERT example's model as a torch::nn::Sequential of layers of several
// tensors, so that a pipeline may cut it between any two of them:
//
//   embeddings   {tokens [N, L], padding [N, L]} -> {hidden [L, N, E], padding}
//   encoder x3   {hidden, padding} -> {hidden, padding}   (conveyor::EncoderLayer, key_padding_mask)
//   mlm head     {hidden, padding} -> {logits [N, L, V]}   (dense, GELU, LayerNorm, decoder)
//
// The hidden states and the padding mask cross every stage boundary. The
// decoder's weight is tied to the token embedding (tied_parameters names the
// two copies).

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <string>
#include <vector>

namespace conveyor::examples {

struct BertConfig {
  int64_t vocab = 2000;
  int64_t hidden = 64;
  int64_t heads = 2;
  int64_t layers = 3;
  int64_t feedforward = 256;
  int64_t max_len = 64;  // positions
  int64_t pad_id = 0;
  double dropout = 0.1;
};

struct BertModel {
  torch::nn::Sequential layers;
  std::vector<std::string> names;   // one per layer, for the plan
  std::vector<double> costs;        // rough multiply-adds per piece, for balancing the stages
  std::vector<std::string> tied;    // {token embedding, decoder weight}: parameter names of one logical weight
};

// Throws std::invalid_argument naming the setting when hidden is not a
// multiple of heads or a size is below 1. Weights: normal(0, 0.02), biases 0,
// LayerNorm 1 and 0, as BERT initialises them; the decoder starts as a copy
// of the token embedding.
BertModel make_bert(const BertConfig& config);

// Mean cross-entropy over the positions whose label is not kIgnore, for
// logits [N, L, V] and labels [N, L].
at::Tensor mlm_loss(const at::Tensor& logits, const at::Tensor& labels);

// The summed cross-entropy and the number of correct top-1 predictions over
// the positions whose label is not kIgnore.
struct MlmScore {
  double loss_sum = 0;
  int64_t correct = 0, predictions = 0;
};
MlmScore mlm_score(const at::Tensor& logits, const at::Tensor& labels);

}  // namespace conveyor::examples
