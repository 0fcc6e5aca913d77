#pragma once
// The models the pipeline benchmarks share (bench_pipeline.cpp,
// growth_table.cpp, choice_table.cpp).

#include "examples/common/resnet.h"
#include "ops/fused_attention/encoder_layer.h"
#include "plugin/conveyor.h"

#include <torch/torch.h>

#include <string>

namespace conveyor::bench {

// conveyor::EncoderLayer on batch-first tensors [N, S, E] (the layer takes
// [S, N, E]), so that micro-batches split the batch, not the sequence.
class BatchFirstEncoderImpl : public torch::nn::Module {
 public:
  BatchFirstEncoderImpl(int64_t d_model, int64_t heads, int64_t feedforward)
      : layer(register_module("layer", conveyor::EncoderLayer(torch::nn::TransformerEncoderLayerOptions(d_model, heads)
                                                                  .dim_feedforward(feedforward)
                                                                  .dropout(0.0)))) {}
  at::Tensor forward(const at::Tensor& x) { return layer->forward(x.transpose(0, 1)).transpose(0, 1); }
  conveyor::EncoderLayer layer;
};
TORCH_MODULE(BatchFirstEncoder);

// "lstm": the demo's LSTM language model at benchmark size (embedding
// 10,000 x 128, three LSTMs of 256, linear to 10,000; 5 layers); "mlp":
// 8 x (Linear(512, 512) + Tanh); "resnet": ResNet-20 on 32 x 32 images;
// "transformer": tokens (vocabulary 2,000) embedded in 128, four encoder
// layers (4 heads, feed-forward 512, no dropout), linear to 2,000; 6 layers.
inline torch::nn::Sequential make_model(const std::string& kind) {
  if (kind == "resnet") return conveyor::examples::make_resnet({.depth = 20, .width = 16});
  if (kind == "transformer") {
    torch::nn::Sequential m(torch::nn::Embedding(2000, 128));
    for (int i = 0; i < 4; ++i) m->push_back(BatchFirstEncoder(128, 4, 512));
    m->push_back(torch::nn::Linear(128, 2000));
    return m;
  }
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

// A batch of `batch` random samples for make_model(kind) and its loss:
// tokens of 35 words (lstm) or 32 (transformer) with next-token targets and
// cross-entropy over the vocabulary; images and class labels (resnet); inputs
// and targets of 512 with the mean squared error (mlp).
struct BenchData {
  at::Tensor x, y;
  LossFn loss;
};
inline BenchData make_data(const std::string& kind, int64_t batch) {
  const auto token_loss = [](const at::Tensor& out, const at::Tensor& t) {
    return torch::nn::functional::cross_entropy(out.reshape({-1, out.size(-1)}), t.reshape({-1}));
  };
  if (kind == "lstm") return {torch::randint(10000, {batch, 35}), torch::randint(10000, {batch, 35}), token_loss};
  if (kind == "transformer") return {torch::randint(2000, {batch, 32}), torch::randint(2000, {batch, 32}), token_loss};
  if (kind == "resnet") {
    return {torch::randn({batch, 3, 32, 32}), torch::randint(10, {batch}),
            [](const at::Tensor& out, const at::Tensor& t) { return torch::nn::functional::cross_entropy(out, t); }};
  }
  return {torch::randn({batch, 512}), torch::randn({batch, 512}),
          [](const at::Tensor& out, const at::Tensor& t) { return torch::mse_loss(out, t); }};
}

}  // namespace conveyor::bench
