#pragma once
// The demo's word-level LSTM language model, as a torch::nn::Sequential a
// pipeline cuts into stages: embedding -> dropout -> LSTM -> dropout -> LSTM
// -> dropout -> linear.

#include "examples/common/text_corpus.h"
#include "plugin/pipeline.h"

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace conveyor::examples {

struct LanguageModel {
  torch::nn::Sequential layers;
  std::vector<std::string> names;  // one per layer, for the plan
  std::vector<double> costs;       // rough multiply-adds per word, forward and backward, for the split
  torch::nn::Linear decoder{nullptr};
};

LanguageModel make_language_model(int64_t vocab, int64_t embed, int64_t hidden, double dropout);

// Starts the decoder's bias at the log unigram frequencies of the train split
// (add-one smoothed), so that the first steps need not learn how often each
// word occurs and go straight to learning from context.
void init_decoder_bias(torch::nn::Linear& decoder, const std::vector<int64_t>& train, int64_t vocab);

// Mean cross-entropy over every word of [batch, time, vocab] logits.
at::Tensor lm_loss(const at::Tensor& output, const at::Tensor& target);

// Window `index` of `grid`: [rows, len] inputs and the targets one word later.
std::pair<at::Tensor, at::Tensor> window_tensors(const TokenGrid& grid, int64_t index, int64_t bptt);

// Mean cross-entropy (nats per word) of the pipeline on every window of `grid`.
double evaluate(Pipeline& pipe, const TokenGrid& grid, int64_t bptt);

// Scales the gradients so that their global L2 norm is at most max_norm (0:
// no limit); returns the norm before scaling. Works across devices.
double clip_global_norm(const std::vector<at::Tensor>& params, double max_norm);

}  // namespace conveyor::examples
