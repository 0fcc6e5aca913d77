// swap_fused_ops on torch::nn::LSTMs wherever they sit: FirstOutput adapters
// in a Sequential, bare entries, ModuleList, ModuleDict and typed members.

#include "fused_lstm_testing.h"
#include "ops/adapters.h"
#include "ops/fused_lstm/fused_lstm_module.h"
#include "ops/swap.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <tuple>

namespace {

using conveyor::FusedLSTMImpl;
using conveyor::testing::copy_parameters;
using conveyor::testing::expect_close;
using ::testing::HasSubstr;
using torch::nn::LSTM;
using torch::nn::LSTMOptions;
using LstmResult = std::tuple<at::Tensor, std::tuple<at::Tensor, at::Tensor>>;

// A Sequential of FirstOutput<LSTM> layers, as the pipeline runtime uses them.
torch::nn::Sequential make_lstm_stack() {
  torch::nn::Sequential m(torch::nn::Linear(4, 6), conveyor::FirstOutput<LSTM>(LSTMOptions(6, 8).batch_first(true)),
                          conveyor::FirstOutput<LSTM>(LSTMOptions(8, 7).num_layers(2).batch_first(true)),
                          conveyor::FirstOutput<LSTM>(LSTMOptions(7, 5).batch_first(true).bidirectional(true)),
                          torch::nn::Linear(10, 3));
  m->to(torch::kFloat64);
  return m;
}

void expect_same_outputs_and_grads(torch::nn::Module& a, torch::nn::Module& b,
                                   const std::function<at::Tensor(const at::Tensor&)>& fa,
                                   const std::function<at::Tensor(const at::Tensor&)>& fb, const at::Tensor& x) {
  const at::Tensor xa = x.clone().requires_grad_(), xb = x.clone().requires_grad_();
  const at::Tensor ya = fa(xa), yb = fb(xb);
  expect_close(ya, yb, 1e-10, false, "output");
  const at::Tensor w = torch::randn_like(ya);
  (ya * w).sum().backward();
  (yb * w).sum().backward();
  expect_close(xa.grad(), xb.grad(), 1e-10, false, "grad input");
  const auto pb = b.named_parameters();
  for (const auto& p : a.named_parameters()) expect_close(p.value().grad(), pb[p.key()].grad(), 1e-10, false, p.key());
}

TEST(SwapFusedOps, SequentialOfFirstOutputLstms) {
  torch::manual_seed(6);
  auto model = make_lstm_stack();
  auto reference = torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone()));
  const at::Tensor w_before = model->named_parameters()["1.inner.weight_ih_l0"];

  const conveyor::SwapReport report = conveyor::swap_fused_ops(model.ptr());
  EXPECT_EQ(report.swapped_paths(), (std::vector<std::string>{"1.inner", "2.inner"}));
  ASSERT_EQ(report.skipped.size(), 1u) << report.to_string();
  EXPECT_EQ(report.skipped[0].path, "3.inner");
  EXPECT_THAT(report.skipped[0].reason, HasSubstr("bidirectional"));
  EXPECT_NE(std::dynamic_pointer_cast<FusedLSTMImpl>(model->named_modules()["1.inner"]), nullptr);
  EXPECT_NE(std::dynamic_pointer_cast<LSTM::Impl>(model->named_modules()["3.inner"]), nullptr);
  // Same tensors, not copies: an optimizer built before the swap still applies.
  EXPECT_TRUE(model->named_parameters()["1.inner.weight_ih_l0"].is_same(w_before));

  auto run = [](torch::nn::Sequential& m) { return [&m](const at::Tensor& x) { return m->forward(x); }; };
  const at::Tensor x = torch::randn({3, 5, 4}, torch::kFloat64);
  expect_same_outputs_and_grads(*model, *reference, run(model), run(reference), x);

  // Cloning a swapped model deep-copies the fused layers.
  auto copy = torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone()));
  EXPECT_NE(std::dynamic_pointer_cast<FusedLSTMImpl>(copy->named_modules()["2.inner"]), nullptr);
  const std::string name = "2.inner.weight_hh_l1";
  EXPECT_FALSE(copy->named_parameters()[name].is_same(model->named_parameters()[name]));
  expect_close(copy->forward(x), reference->forward(x), 1e-10, false, "clone output");
}

TEST(SwapFusedOps, LstmDirectlyInSequentialReplacesTheEntry) {
  torch::manual_seed(7);
  torch::nn::Sequential seq(LSTM(LSTMOptions(3, 4)));
  const auto report = conveyor::swap_fused_ops(seq.ptr());
  EXPECT_EQ(report.swapped_paths(), std::vector<std::string>{"0"});
  EXPECT_NE(std::dynamic_pointer_cast<FusedLSTMImpl>(seq->ptr(0)), nullptr);
  EXPECT_NE(std::dynamic_pointer_cast<FusedLSTMImpl>(seq->begin()->ptr()), nullptr);
  const auto out = seq->forward<LstmResult>(torch::randn({2, 1, 3}));
  EXPECT_EQ(std::get<0>(out).sizes().vec(), (std::vector<int64_t>{2, 1, 4}));
}

// A user module: LSTMs in a ModuleList, a ModuleDict, and a typed member.
struct StackNet : torch::nn::Module {
  StackNet() {
    layers =
        register_module("layers", torch::nn::ModuleList(LSTM(LSTMOptions(3, 5)), LSTM(LSTMOptions(5, 5).num_layers(2)),
                                                        LSTM(LSTMOptions(4, 6).proj_size(3))));
    std::vector<std::pair<std::string, std::shared_ptr<Module>>> named{{"top", LSTM(LSTMOptions(5, 4)).ptr()}};
    by_name = register_module("by_name", torch::nn::ModuleDict(named));
    typed = register_module("typed", LSTM(LSTMOptions(4, 4)));
    to(torch::kFloat64);
  }
  static at::Tensor first_output(const std::shared_ptr<Module>& m, const at::Tensor& x) {
    if (auto fused = std::dynamic_pointer_cast<FusedLSTMImpl>(m)) return std::get<0>(fused->forward(x));
    return std::get<0>(std::dynamic_pointer_cast<LSTM::Impl>(m)->forward(x));
  }
  at::Tensor forward(at::Tensor x) {
    x = first_output(layers[0], x);
    x = first_output(layers[1], x);
    x = first_output(by_name["top"], x);
    x = std::get<0>(typed->forward(x));
    return first_output(layers[2], x);
  }
  torch::nn::ModuleList layers{nullptr};
  torch::nn::ModuleDict by_name{nullptr};
  LSTM typed{nullptr};
};

TEST(SwapFusedOps, ModuleListModuleDictAndTypedMembers) {
  torch::manual_seed(8);
  auto net = std::make_shared<StackNet>();
  auto reference = std::make_shared<StackNet>();
  copy_parameters(*net, *reference);

  const auto report = conveyor::swap_fused_ops(net);
  EXPECT_EQ(report.swapped_paths(), (std::vector<std::string>{"layers.0", "layers.1", "by_name.top"}));
  ASSERT_TRUE(report.skip_reason("layers.2").has_value()) << report.to_string();
  EXPECT_THAT(*report.skip_reason("layers.2"), HasSubstr("proj_size=3"));
  ASSERT_TRUE(report.skip_reason("typed").has_value()) << report.to_string();
  EXPECT_THAT(*report.skip_reason("typed"), HasSubstr("parent keeps a typed member"));
  EXPECT_EQ(net->named_modules()["typed"], net->typed.ptr());  // untouched, still consistent

  const at::Tensor x = torch::randn({4, 2, 3}, torch::kFloat64);
  expect_same_outputs_and_grads(
      *net, *reference, [&](const at::Tensor& t) { return net->forward(t); },
      [&](const at::Tensor& t) { return reference->forward(t); }, x);

  const auto root = conveyor::swap_fused_ops(LSTM(LSTMOptions(2, 2)).ptr());
  EXPECT_TRUE(root.swapped.empty());
  ASSERT_TRUE(root.skip_reason("").has_value());
  EXPECT_THAT(*root.skip_reason(""), HasSubstr("root"));
}

}  // namespace
