// FusedMultiheadAttention against torch::nn::MultiheadAttention, and an
// encoder of conveyor::EncoderLayer before and after swapping its attention.
// CUDA cases skip without a device.

#include "fused_attention_testing.h"
#include "ops/fused_attention/encoder_layer.h"
#include "ops/fused_attention/fused_attention_module.h"
#include "ops/fused_attention/fused_attention_swap.h"
#include "ops/swap.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace conveyor {
namespace {

using ::testing::HasSubstr;

// Copies every parameter of `from` into the parameter of `to` with the same name.
void copy_parameters_by_name(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  auto dst = to.named_parameters();
  const auto src = from.named_parameters();
  ASSERT_EQ(src.size(), dst.size());
  for (const auto& item : src) {
    at::Tensor* p = dst.find(item.key());
    ASSERT_NE(p, nullptr) << item.key();
    p->copy_(item.value());
  }
}

// Gradients of every parameter, by name.
void expect_parameter_grads_equal(torch::nn::Module& a, torch::nn::Module& b, double tolerance) {
  const auto pb = b.named_parameters();
  for (const auto& item : a.named_parameters()) {
    SCOPED_TRACE(item.key());
    const at::Tensor* other = pb.find(item.key());
    ASSERT_NE(other, nullptr);
    ASSERT_TRUE(item.value().grad().defined());
    ASSERT_TRUE(other->grad().defined());
    EXPECT_LE(relative_error(other->grad(), item.value().grad()), tolerance);
  }
}

struct MhaCase {
  int64_t embed_dim, heads, kdim, vdim;
  bool self_attention, padded;
};

TEST(FusedMultiheadAttention, MatchesTorchMultiheadAttention) {
  torch::manual_seed(6);
  const std::vector<MhaCase> all = {{16, 4, 16, 16, true, false},
                                    {16, 4, 16, 16, true, true},
                                    {16, 2, 16, 16, false, true},
                                    {16, 4, 12, 12, false, false},
                                    {16, 4, 12, 12, false, true}};  // torch's C++ module needs kdim == vdim
  const int64_t L = 7, S = 9, N = 3;
  for (const MhaCase& c : all) {
    SCOPED_TRACE("E=" + std::to_string(c.embed_dim) + " kdim=" + std::to_string(c.kdim) + " vdim=" +
                 std::to_string(c.vdim) + (c.self_attention ? " self" : " cross") + (c.padded ? " padded" : ""));
    const auto options = torch::nn::MultiheadAttentionOptions(c.embed_dim, c.heads).kdim(c.kdim).vdim(c.vdim);
    torch::nn::MultiheadAttention mha(options);
    FusedMultiheadAttention fused(options);
    mha->to(torch::kFloat64);
    fused->to(torch::kFloat64);
    copy_parameters_by_name(*mha, *fused);

    const int64_t s = c.self_attention ? L : S;
    const at::Tensor query = torch::randn({L, N, c.embed_dim}, torch::kFloat64);
    const at::Tensor key = c.self_attention ? query : torch::randn({s, N, c.kdim}, torch::kFloat64);
    const at::Tensor value = c.self_attention ? query : torch::randn({s, N, c.vdim}, torch::kFloat64);
    at::Tensor padding;
    if (c.padded) {
      padding = torch::rand({N, s}) < 0.3;
      padding.select(1, 0).fill_(false);
    }
    auto run_module = [&](auto& module) {
      const at::Tensor qi = query.detach().requires_grad_(true);
      const at::Tensor ki = c.self_attention ? qi : key.detach().requires_grad_(true);
      const at::Tensor vi = c.self_attention ? qi : value.detach().requires_grad_(true);
      auto [out, weights] = module->forward(qi, ki, vi, padding, /*need_weights=*/false);
      EXPECT_FALSE(weights.defined());
      (out * torch::linspace(-1, 1, out.numel(), torch::kFloat64).view_as(out)).sum().backward();
      return std::vector<at::Tensor>{out.detach(), qi.grad(), c.self_attention ? qi.grad() : ki.grad(),
                                     c.self_attention ? qi.grad() : vi.grad()};
    };
    const auto want = run_module(mha);
    const auto got = run_module(fused);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_LE(relative_error(got[i], want[i]), 1e-10) << "tensor " << i;
    expect_parameter_grads_equal(*mha, *fused, 1e-10);
  }
}

TEST(FusedMultiheadAttention, CausalFlagAndRecognisedCausalMaskMatchMaskedMath) {
  torch::manual_seed(7);
  const int64_t L = 10, N = 2, E = 16;
  torch::nn::MultiheadAttention mha(E, 4);
  FusedMultiheadAttention fused(torch::nn::MultiheadAttentionOptions(E, 4), /*causal=*/true);
  FusedMultiheadAttention plain(E, 4);
  for (torch::nn::Module* m : std::initializer_list<torch::nn::Module*>{mha.get(), fused.get(), plain.get()}) {
    m->to(torch::kFloat64);
  }
  copy_parameters_by_name(*mha, *fused);
  copy_parameters_by_name(*mha, *plain);
  const at::Tensor x = torch::randn({L, N, E}, torch::kFloat64);
  const at::Tensor float_causal =
      torch::zeros({L, L}, torch::kFloat64)
          .masked_fill(torch::ones({L, L}, torch::kBool).triu(1), -std::numeric_limits<double>::infinity());
  const at::Tensor want = std::get<0>(mha->forward(x, x, x, {}, false, float_causal));
  EXPECT_LE(relative_error(std::get<0>(fused->forward(x, x, x, {}, false)), want), 1e-10);
  EXPECT_LE(relative_error(std::get<0>(plain->forward(x, x, x, {}, false, float_causal)), want), 1e-10);
  const at::Tensor bool_causal = torch::ones({L, L}, torch::kBool).triu(1);
  EXPECT_LE(relative_error(std::get<0>(plain->forward(x, x, x, {}, false, bool_causal)), want), 1e-10);
  // need_weights falls back to the math path and returns MultiheadAttention's weights.
  const auto [out_w, weights] = fused->forward(x, x, x);
  const auto [want_out_w, want_weights] = mha->forward(x, x, x, {}, true, float_causal);
  ASSERT_TRUE(weights.defined());
  EXPECT_LE(relative_error(out_w, want_out_w), 1e-10);
  EXPECT_LE(relative_error(weights, want_weights), 1e-10);
}

TEST(FusedMultiheadAttention, SwapHookSharesWeightsAndRejectsOtherModules) {
  torch::nn::MultiheadAttention mha(torch::nn::MultiheadAttentionOptions(8, 2).add_bias_kv(true).add_zero_attn(true));
  mha->to(torch::kFloat64);
  mha->eval();
  const auto swapped = make_fused_attention_from(mha.ptr());
  ASSERT_TRUE(swapped.has_value());
  auto fused = swapped->get<FusedMultiheadAttention>();
  EXPECT_FALSE(fused->is_training());
  // The same parameter tensors, not copies: an optimizer built on mha still applies.
  EXPECT_TRUE(fused->in_proj_weight.is_same(mha->in_proj_weight));
  EXPECT_TRUE(fused->bias_k.is_same(mha->bias_k));
  EXPECT_TRUE(fused->out_proj->weight.is_same(mha->out_proj->weight));
  EXPECT_EQ(fused->named_parameters().size(), mha->named_parameters().size());
  const at::Tensor x = torch::randn({5, 2, 8}, torch::kFloat64);
  const at::Tensor padding = torch::tensor({false, true, false, false, true}).repeat({2, 1});
  EXPECT_LE(relative_error(std::get<0>(fused->forward(x, x, x, padding, false)),
                           std::get<0>(mha->forward(x, x, x, padding, false))),
            1e-10);
  std::string why;
  EXPECT_FALSE(make_fused_attention_from(torch::nn::Linear(3, 3).ptr(), &why).has_value());
  EXPECT_THAT(why, HasSubstr("is not a torch::nn::MultiheadAttention"));
}

TEST(EncoderLayer, MatchesTorchTransformerEncoderLayer) {
  torch::manual_seed(8);
  const auto options = torch::nn::TransformerEncoderLayerOptions(16, 4).dim_feedforward(32).dropout(0.0);
  torch::nn::TransformerEncoderLayer reference(options);
  EncoderLayer layer(options);
  reference->to(torch::kFloat64);
  layer->to(torch::kFloat64);
  copy_parameters_by_name(*reference, *layer);  // same names, so this is a state-dict transfer
  const at::Tensor src = torch::randn({6, 3, 16}, torch::kFloat64);
  const at::Tensor padding = torch::tensor({false, false, true, false, false, true}).repeat({3, 1});
  EXPECT_LE(relative_error(layer(src, at::Tensor(), padding), reference(src, at::Tensor(), padding)), 1e-10);
}

// Two layers; gradients compared for the input and every parameter by name.
TEST(EncoderLayer, SwappingAttentionKeepsOutputsAndGradients) {
  torch::manual_seed(9);
  const auto options = torch::nn::TransformerEncoderLayerOptions(16, 4).dim_feedforward(32).dropout(0.1);
  const EncoderLayer first(options), second(options);
  torch::nn::Sequential reference(first, second);
  reference->to(torch::kFloat64);
  reference->eval();
  auto swapped = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(reference->clone());
  ASSERT_NE(swapped, nullptr);
  // Layer 0 through set_self_attn, layer 1 through replace_module.
  auto* layer0 = swapped->ptr(0)->as<EncoderLayerImpl>();
  auto* layer1 = swapped->ptr(1)->as<EncoderLayerImpl>();
  std::string why;
  auto fused0 = make_fused_attention_from(layer0->named_children()["self_attn"], &why);
  auto fused1 = make_fused_attention_from(layer1->named_children()["self_attn"], &why);
  ASSERT_TRUE(fused0.has_value() && fused1.has_value()) << why;
  layer0->set_self_attn(*fused0);
  layer1->replace_module("self_attn", fused1->ptr());
  for (const auto& item : swapped->named_modules()) {
    EXPECT_EQ(item.value()->as<torch::nn::MultiheadAttentionImpl>(), nullptr) << item.key() << " was not swapped";
  }

  const at::Tensor src = torch::randn({8, 2, 16}, torch::kFloat64);
  const at::Tensor padding = torch::tensor({false, false, false, true, false, false, true, true}).repeat({2, 1});
  auto forward_backward = [&](torch::nn::SequentialImpl& encoder) {
    const at::Tensor x = src.detach().requires_grad_(true);
    at::Tensor y = x;
    for (const auto& layer : encoder.children()) y = layer->as<EncoderLayerImpl>()->forward(y, {}, padding);
    (y * torch::linspace(-2, 2, y.numel(), torch::kFloat64).view_as(y)).sum().backward();
    return std::pair{y.detach(), x.grad()};
  };
  const auto [want_out, want_grad] = forward_backward(*reference);
  const auto [got_out, got_grad] = forward_backward(*swapped);
  EXPECT_LE(relative_error(got_out, want_out), 1e-10);
  EXPECT_LE(relative_error(got_grad, want_grad), 1e-10);
  expect_parameter_grads_equal(*reference, *swapped, 1e-10);
}

TEST(EncoderLayer, SwapFusedOpsReplacesAttentionItCanReach) {
  torch::manual_seed(12);
  const auto options = torch::nn::TransformerEncoderLayerOptions(16, 4).dim_feedforward(32).dropout(0.0);
  EncoderLayer first(options), second(options);
  torch::nn::TransformerEncoderLayer typed(options);
  torch::nn::Sequential model(first, second, typed);
  model->to(torch::kFloat64);
  const at::Tensor x = torch::randn({5, 2, 16}, torch::kFloat64);
  const at::Tensor before = first(x);
  const at::Tensor weight = first->named_parameters()["self_attn.in_proj_weight"];

  const SwapReport report = swap_fused_ops(model.ptr());
  EXPECT_EQ(report.swapped_paths(), (std::vector<std::string>{"0.self_attn", "1.self_attn"})) << report.to_string();
  ASSERT_TRUE(report.skip_reason("2.self_attn").has_value()) << report.to_string();
  EXPECT_THAT(*report.skip_reason("2.self_attn"), HasSubstr("typed member"));
  EXPECT_NE(first->self_attn.ptr()->as<FusedMultiheadAttentionImpl>(), nullptr);
  EXPECT_TRUE(first->named_parameters()["self_attn.in_proj_weight"].is_same(weight));
  EXPECT_LE(relative_error(first(x), before), 1e-10);
}

TEST(FusedAttentionCuda, FusedMultiheadAttentionMatchesOnDevice) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(11);
  FusedMultiheadAttention cpu(torch::nn::MultiheadAttentionOptions(128, 2), /*causal=*/true);
  auto gpu = std::dynamic_pointer_cast<FusedMultiheadAttentionImpl>(cpu->clone(torch::kCUDA));
  gpu->to(torch::kBFloat16);
  const at::Tensor x = torch::randn({33, 3, 128});
  const at::Tensor want = std::get<0>(cpu->forward(x, x, x, {}, false));
  const at::Tensor xg = x.to(torch::kCUDA, torch::kBFloat16);
  const at::Tensor got = std::get<0>(gpu->forward(xg, xg, xg, {}, false));
  EXPECT_LE(relative_error(got.cpu(), want), 3e-2);
}

}  // namespace
}  // namespace conveyor
