#pragma once
// Small models and a gradient comparison shared by the pipeline tests.

#include "plugin/conveyor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

namespace conveyor::testing {

// The synchronous schedules every exact-gradient test runs.
inline constexpr const char* kSyncSchedules[] = {"sequential", "gpipe", "1f1b"};

// 7 layers: enough for K = 1..4 with several possible cuts.
inline torch::nn::Sequential make_mlp(torch::Dtype dtype = torch::kFloat64) {
  torch::nn::Sequential m(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 16), torch::nn::ReLU(),
                          torch::nn::Linear(16, 8), torch::nn::Tanh(), torch::nn::Linear(8, 3));
  m->to(dtype);
  return m;
}

constexpr int64_t kVocab = 40;

// The demo's language model in miniature: embedding -> LSTM -> LSTM -> linear.
inline torch::nn::Sequential make_lstm_lm(torch::Dtype dtype = torch::kFloat64) {
  torch::nn::Sequential m(torch::nn::Embedding(kVocab, 8),
                          conveyor::FirstOutput<torch::nn::LSTM>(torch::nn::LSTMOptions(8, 12).batch_first(true)),
                          conveyor::FirstOutput<torch::nn::LSTM>(torch::nn::LSTMOptions(12, 12).batch_first(true)),
                          torch::nn::Linear(12, kVocab));
  m->to(dtype);
  return m;
}

// Identity forward; multiplies the gradient by *factor (inf: an overflow in
// the gradients of the layers before it, and only theirs).
struct ScaleGradient : torch::autograd::Function<ScaleGradient> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, double factor) {
    ctx->saved_data["factor"] = factor;
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    return {g[0] * ctx->saved_data["factor"].toDouble(), at::Tensor()};
  }
};

struct GradBombImpl : torch::nn::Cloneable<GradBombImpl> {
  explicit GradBombImpl(std::shared_ptr<double> factor) : factor(std::move(factor)) {}
  void reset() override {}  // a clone shares the factor
  at::Tensor forward(const at::Tensor& x) { return ScaleGradient::apply(x, *factor); }
  std::shared_ptr<double> factor;
};
TORCH_MODULE(GradBomb);


// SGD with this learning rate and momentum, one per stage.
inline OptimizerFactory sgd(double lr, double momentum = 0) {
  return [lr, momentum](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(lr).momentum(momentum));
  };
}

inline torch::nn::Sequential clone_of(const torch::nn::Sequential& m) {
  return torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(m->clone()));
}

inline at::Tensor lm_loss(const at::Tensor& out, const at::Tensor& target) {
  return torch::nn::functional::cross_entropy(out.reshape({-1, out.size(-1)}), target.reshape({-1}));
}

inline at::Tensor mse(const at::Tensor& out, const at::Tensor& target) { return torch::mse_loss(out, target); }
inline at::Tensor mse_of_first(const Tensors& out, const Tensors& target) { return mse(out[0], target[0]); }

// Every parameter's gradient in the pipeline equals the reference's:
// |diff| <= abs_tol + rel_tol * max|reference grad|.
inline void expect_same_grads(const StageRunner& pipe, const torch::nn::Sequential& reference, double abs_tol,
                              double rel_tol, const std::string& where) {
  const auto ref = reference->named_parameters();
  const auto got = pipe.named_parameters();
  ASSERT_EQ(got.size(), ref.size()) << where;
  for (const auto& [name, p] : got) {
    const at::Tensor* r = ref.find(name);
    ASSERT_NE(r, nullptr) << where << ": no reference parameter " << name;
    ASSERT_TRUE(p.grad().defined()) << where << ": no gradient for " << name;
    ASSERT_TRUE(r->grad().defined()) << where << ": no reference gradient for " << name;
    const double scale = r->grad().abs().max().item<double>();
    const double diff = (p.grad().cpu() - r->grad().cpu()).abs().max().item<double>();
    EXPECT_LE(diff, abs_tol + rel_tol * scale) << where << ": gradient of " << name << " differs by " << diff;
  }
}

}  // namespace conveyor::testing
