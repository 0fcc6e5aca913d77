#pragma once
// The models the pipeline benchmarks share (bench_pipeline.cpp, growth_table.cpp).

#include "examples/common/resnet.h"
#include "plugin/conveyor.h"

#include <torch/torch.h>

#include <string>

namespace conveyor::bench {

// "lstm": the demo's LSTM language model at benchmark size (embedding
// 10,000 x 128, three LSTMs of 256, linear to 10,000; 5 layers); "mlp":
// 8 x (Linear(512, 512) + Tanh); "resnet": ResNet-20 on 32 x 32 images.
inline torch::nn::Sequential make_model(const std::string& kind) {
  if (kind == "resnet") return conveyor::examples::make_resnet({.depth = 20, .width = 16});
  if (kind == "mlp") {
    torch::nn::Sequential m;
    for (int i = 0; i < 8; ++i) {
      m->push_back(torch::nn::Linear(512, 512));
      m->push_back(torch::nn::Tanh());
    }
    return m;
  }
  return torch::nn::Sequential(
      torch::nn::Embedding(10000, 128),
      conveyor::FirstOutput<torch::nn::LSTM>(torch::nn::LSTMOptions(128, 256).batch_first(true)),
      conveyor::FirstOutput<torch::nn::LSTM>(torch::nn::LSTMOptions(256, 256).batch_first(true)),
      conveyor::FirstOutput<torch::nn::LSTM>(torch::nn::LSTMOptions(256, 256).batch_first(true)),
      torch::nn::Linear(256, 10000));
}

}  // namespace conveyor::bench
