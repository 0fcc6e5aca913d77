#pragma once
// The demo's word-level LSTM language model, as a torch::nn::Sequential a
// pipeline cuts into stages: embedding -> dropout -> LSTM -> dropout -> LSTM
// -> dropout -> linear.

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <string>
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

}  // namespace conveyor::examples
