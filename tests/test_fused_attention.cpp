// conveyor::fused_attention against a float64 math reference written out here
// and against at::scaled_dot_product_attention; FusedMultiheadAttention
// against torch::nn::MultiheadAttention; an encoder of conveyor::EncoderLayer
// before and after swapping its attention. CUDA cases skip without a device.

#include "ops/fused_attention/encoder_layer.h"
#include "ops/fused_attention/fused_attention.h"
#include "ops/fused_attention/fused_multihead_attention.h"
#include "ops/fused_attention/swap_attention.h"
#include "ops/swap.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <string>
#include <vector>

namespace conveyor {
namespace {

using ::testing::HasSubstr;

enum class Padding { kNone, kRandom, kWholeBatch, kFirstKey };

struct Case {
  int64_t batch, heads, q_len, k_len, head_dim;
  bool causal;
  Padding padding;
};

std::string describe(const Case& c) {
  return "B=" + std::to_string(c.batch) + " H=" + std::to_string(c.heads) + " Sq=" + std::to_string(c.q_len) +
         " Sk=" + std::to_string(c.k_len) + " D=" + std::to_string(c.head_dim) + (c.causal ? " causal" : "") +
         " padding=" + std::to_string(static_cast<int>(c.padding));
}

// bool [B, S_k], true = ignore that key.
at::Tensor make_padding(const Case& c) {
  switch (c.padding) {
    case Padding::kNone:
      return {};
    case Padding::kRandom: {  // about a third of the keys, never all of a row
      at::Tensor m = torch::rand({c.batch, c.k_len}) < 0.35;
      m.select(1, 0).fill_(false);
      return m;
    }
    case Padding::kWholeBatch: {  // every key of batch 0: all its query rows fully masked
      at::Tensor m = torch::zeros({c.batch, c.k_len}, torch::kBool);
      m.select(0, 0).fill_(true);
      return m;
    }
    case Padding::kFirstKey: {  // with causal, query 0 sees no key at all
      at::Tensor m = torch::zeros({c.batch, c.k_len}, torch::kBool);
      m.select(1, 0).fill_(true);
      return m;
    }
  }
  return {};
}

// True where query i must not see key j, [B, 1, S_q, S_k].
at::Tensor hidden_keys(const Case& c, const at::Tensor& padding) {
  at::Tensor hidden = torch::zeros({c.batch, 1, c.q_len, c.k_len}, torch::kBool);
  if (c.causal) {
    hidden = hidden | torch::ones({c.q_len, c.k_len}, torch::kBool).triu(1);  // top-left aligned
  }
  if (padding.defined()) hidden = hidden | padding.view({c.batch, 1, 1, c.k_len});
  return hidden;
}

// The definition, in float64: softmax(q k^T * scale + mask) v, where a row
// with every key masked is defined to be 0 (its gradients then vanish too).
at::Tensor math_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& hidden,
                          double scale) {
  at::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * scale;
  scores = scores.masked_fill(hidden, -std::numeric_limits<double>::infinity());
  const at::Tensor empty_row = hidden.all(-1, /*keepdim=*/true);
  const at::Tensor p = torch::softmax(scores.masked_fill(empty_row, 0.0), -1).masked_fill(empty_row, 0.0);
  return torch::matmul(p, v);
}

// max |a - b| / max(max |b|, 1): an error relative to the tensor's own scale,
// or absolute where the reference is all below 1 (a gradient that is exactly
// zero in exact arithmetic, as with a single key, has no scale of its own;
// the inputs here are all of order 1).
double relative_error(const at::Tensor& a, const at::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1.0);
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>() / scale;
}

struct Result {
  at::Tensor out, grad_q, grad_k, grad_v;
};

// Output and input gradients of f(q, k, v) for the upstream gradient grad_out.
template <typename F>
Result run(F f, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& grad_out) {
  const at::Tensor qd = q.detach().requires_grad_(true);
  const at::Tensor kd = k.detach().requires_grad_(true);
  const at::Tensor vd = v.detach().requires_grad_(true);
  const at::Tensor out = f(qd, kd, vd);
  const auto grads = torch::autograd::grad({out}, {qd, kd, vd}, {grad_out.to(out.dtype())});
  return {out.detach(), grads[0], grads[1], grads[2]};
}

void expect_close(const Result& got, const Result& want, double tolerance) {
  EXPECT_LE(relative_error(got.out, want.out), tolerance) << "output";
  EXPECT_LE(relative_error(got.grad_q, want.grad_q), tolerance) << "grad q";
  EXPECT_LE(relative_error(got.grad_k, want.grad_k), tolerance) << "grad k";
  EXPECT_LE(relative_error(got.grad_v, want.grad_v), tolerance) << "grad v";
}

std::optional<at::Tensor> optional_mask(const at::Tensor& m) {
  return m.defined() ? std::optional<at::Tensor>(m) : std::nullopt;
}

// Checks fused_attention on `device` in `dtype` against the float64 math
// reference (inputs rounded to dtype first, so only the arithmetic differs).
void check_against_math(const Case& c, torch::Device device, torch::Dtype dtype, double tolerance) {
  SCOPED_TRACE(describe(c) + " dtype=" + std::string(c10::toString(dtype)) + " device=" + device.str());
  const at::Tensor q = torch::randn({c.batch, c.heads, c.q_len, c.head_dim}).to(dtype);
  const at::Tensor k = torch::randn({c.batch, c.heads, c.k_len, c.head_dim}).to(dtype);
  const at::Tensor v = torch::randn({c.batch, c.heads, c.k_len, c.head_dim}).to(dtype);
  const at::Tensor grad_out = torch::randn({c.batch, c.heads, c.q_len, c.head_dim}).to(dtype);
  const at::Tensor padding = make_padding(c);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  const at::Tensor hidden = hidden_keys(c, padding);

  const Result want = run([&](auto& a, auto& b, auto& d) { return math_attention(a, b, d, hidden, scale); },
                          q.to(torch::kDouble), k.to(torch::kDouble), v.to(torch::kDouble), grad_out);
  const at::Tensor mask_on_device = padding.defined() ? padding.to(device) : padding;
  const Result got = run(
      [&](auto& a, auto& b, auto& d) { return fused_attention(a, b, d, optional_mask(mask_on_device), c.causal); },
      q.to(device), k.to(device), v.to(device), grad_out.to(device));
  EXPECT_EQ(got.out.scalar_type(), dtype);
  EXPECT_EQ(got.grad_q.scalar_type(), dtype);
  expect_close({got.out.cpu(), got.grad_q.cpu(), got.grad_k.cpu(), got.grad_v.cpu()}, want, tolerance);
  for (const at::Tensor& t : {got.out, got.grad_q, got.grad_k, got.grad_v}) {
    EXPECT_TRUE(torch::isfinite(t).all().item<bool>());
  }
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {2, 3, 17, 17, 64, false, Padding::kNone},
      {1, 2, 1, 1, 64, false, Padding::kNone},     // T = 1
      {2, 2, 1, 9, 128, false, Padding::kRandom},  // one query, several keys
      {2, 2, 13, 29, 128, true, Padding::kRandom},  // S_q < S_k, causal, padded
      {2, 2, 31, 9, 40, true, Padding::kNone},     // S_q > S_k: rows past S_k see every key
      {1, 3, 70, 70, 40, true, Padding::kRandom},  // spans several CUDA tiles
      {2, 1, 21, 19, 64, false, Padding::kWholeBatch},
      {2, 2, 11, 11, 40, true, Padding::kFirstKey},
  };
  return all;
}

TEST(FusedAttention, MatchesMathReferenceInFloat64) {
  torch::manual_seed(0);
  for (const Case& c : cases()) check_against_math(c, torch::kCPU, torch::kFloat64, 1e-10);
}

TEST(FusedAttention, MatchesMathReferenceInFloat32) {
  torch::manual_seed(1);
  for (const Case& c : cases()) check_against_math(c, torch::kCPU, torch::kFloat32, 1e-5);
}

TEST(FusedAttention, MatchesMathReferenceInBFloat16AndHalf) {
  torch::manual_seed(2);
  for (const Case& c : cases()) {
    check_against_math(c, torch::kCPU, torch::kBFloat16, 2e-2);
    check_against_math(c, torch::kCPU, torch::kFloat16, 5e-3);
  }
}

// at::scaled_dot_product_attention takes a mask of the keys that take part.
TEST(FusedAttention, MatchesScaledDotProductAttention) {
  torch::manual_seed(3);
  for (const Case& c : cases()) {
    if (c.padding == Padding::kWholeBatch || c.padding == Padding::kFirstKey) continue;  // SDPA leaves those undefined
    for (const auto& [dtype, tolerance] : {std::pair{torch::kFloat64, 1e-10}, std::pair{torch::kFloat32, 1e-5}}) {
      SCOPED_TRACE(describe(c) + " dtype=" + std::string(c10::toString(dtype)));
      const auto options = torch::TensorOptions().dtype(dtype);
      const at::Tensor q = torch::randn({c.batch, c.heads, c.q_len, c.head_dim}, options);
      const at::Tensor k = torch::randn({c.batch, c.heads, c.k_len, c.head_dim}, options);
      const at::Tensor v = torch::randn({c.batch, c.heads, c.k_len, c.head_dim}, options);
      const at::Tensor grad_out = torch::randn_like(q);
      const at::Tensor padding = make_padding(c);
      const at::Tensor allowed = hidden_keys(c, padding).logical_not();
      const Result want = run(
          [&](auto& a, auto& b, auto& d) {
            if (!padding.defined()) return at::scaled_dot_product_attention(a, b, d, {}, 0.0, c.causal);
            return at::scaled_dot_product_attention(a, b, d, allowed);
          },
          q, k, v, grad_out);
      const Result got = run(
          [&](auto& a, auto& b, auto& d) { return fused_attention(a, b, d, optional_mask(padding), c.causal); }, q,
          k, v, grad_out);
      expect_close(got, want, tolerance);
    }
  }
}

TEST(FusedAttention, FullyMaskedRowsAreZeroWithFiniteLseAndZeroGradients) {
  torch::manual_seed(4);
  const Case c{2, 2, 6, 5, 40, true, Padding::kFirstKey};  // query 0 of every batch sees nothing
  at::Tensor padding = make_padding(c);
  padding.select(0, 1).fill_(true);  // batch 1: no key at all
  const at::Tensor q = torch::randn({2, 2, 6, 40}, torch::kFloat64).requires_grad_(true);
  const at::Tensor k = torch::randn({2, 2, 5, 40}, torch::kFloat64).requires_grad_(true);
  const at::Tensor v = torch::randn({2, 2, 5, 40}, torch::kFloat64).requires_grad_(true);
  const auto [out, lse] = fused_attention_forward(q, k, v, padding, true, std::nullopt);
  EXPECT_TRUE(torch::isfinite(lse).all().item<bool>());
  EXPECT_TRUE(out.select(0, 1).eq(0).all().item<bool>());
  EXPECT_TRUE(lse.select(0, 1).eq(0).all().item<bool>());
  EXPECT_TRUE(out.select(0, 0).select(1, 0).eq(0).all().item<bool>());
  EXPECT_TRUE(lse.select(0, 0).select(1, 0).eq(0).all().item<bool>());
  EXPECT_GT(out.select(0, 0).select(1, 1).abs().sum().item<double>(), 0.0);  // query 1 sees key 1

  fused_attention(q, k, v, padding, true).sum().backward();
  for (const at::Tensor& g : {q.grad(), k.grad(), v.grad()}) EXPECT_TRUE(torch::isfinite(g).all().item<bool>());
  EXPECT_TRUE(q.grad().select(0, 1).eq(0).all().item<bool>());
  EXPECT_TRUE(k.grad().select(0, 1).eq(0).all().item<bool>());
  EXPECT_TRUE(v.grad().select(0, 1).eq(0).all().item<bool>());
  EXPECT_TRUE(q.grad().select(0, 0).select(1, 0).eq(0).all().item<bool>());
}

TEST(FusedAttention, ExplicitScaleAndOpThroughDispatcher) {
  torch::manual_seed(5);
  const at::Tensor q = torch::randn({1, 2, 7, 16}, torch::kFloat64);
  const at::Tensor k = torch::randn({1, 2, 9, 16}, torch::kFloat64);
  const at::Tensor v = torch::randn({1, 2, 9, 16}, torch::kFloat64);
  const Case c{1, 2, 7, 9, 16, false, Padding::kNone};
  const at::Tensor want = math_attention(q, k, v, hidden_keys(c, {}), 0.3);
  EXPECT_LE(relative_error(fused_attention(q, k, v, std::nullopt, false, 0.3), want), 1e-12);
  const auto op = c10::Dispatcher::singleton()
                      .findSchemaOrThrow("conveyor::fused_attention", "")
                      .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                        const std::optional<at::Tensor>&, bool, std::optional<double>)>();
  EXPECT_LE(relative_error(op.call(q, k, v, std::nullopt, false, 0.3), want), 1e-12);
}

TEST(FusedAttention, RejectsBadInputWithClearMessages) {
  const at::Tensor q = torch::randn({2, 3, 5, 64});
  const at::Tensor k = torch::randn({2, 3, 7, 64});
  const at::Tensor v = torch::randn({2, 3, 7, 64});
  auto expect_error = [](auto f, const std::string& text) {
    EXPECT_THAT(f, ::testing::ThrowsMessage<c10::Error>(HasSubstr(text)));
  };
  expect_error([&] { fused_attention(q.flatten(0, 1), k, v); }, "q must be a 4-D tensor [batch, heads, seq_len, "
                                                                 "head_dim], got a 3-D tensor of shape [6, 5, 64]");
  expect_error([&] { fused_attention(q, torch::randn({2, 3, 7, 32}), v); },
               "k has head_dim (dim 3) 32 but q has 64");
  expect_error([&] { fused_attention(q, k, torch::randn({2, 3, 6, 64})); }, "v has seq_len (dim 2) 6 but k has 7");
  expect_error([&] { fused_attention(q, torch::randn({2, 4, 7, 64}), v); }, "k has heads (dim 1) 4 but q has 3");
  expect_error([&] { fused_attention(q, k, v, torch::zeros({2, 6}, torch::kBool)); },
               "key_padding_mask must have shape [batch=2, k_len=7], got [2, 6]");
  expect_error([&] { fused_attention(q, k, v, torch::zeros({2, 7})); }, "key_padding_mask must be a bool tensor");
  expect_error([&] { fused_attention(q.to(torch::kDouble), k, v); },
               "k has dtype Float but q has dtype Double; q, k and v must share one dtype");
  expect_error([&] { fused_attention(q.to(torch::kInt), k.to(torch::kInt), v.to(torch::kInt)); },
               "q has dtype Int; supported are Float, Double, Half and BFloat16");
}

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
  const std::vector<MhaCase> all = {
      {16, 4, 16, 16, true, false}, {16, 4, 16, 16, true, true}, {16, 2, 16, 16, false, true},
      {16, 4, 12, 12, false, false}, {16, 4, 12, 12, false, true}};  // torch's C++ module needs kdim == vdim
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
  const at::Tensor float_causal = torch::zeros({L, L}, torch::kFloat64)
                                      .masked_fill(torch::ones({L, L}, torch::kBool).triu(1),
                                                   -std::numeric_limits<double>::infinity());
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

TEST(FusedAttentionCuda, MatchesMathReferenceOnDevice) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(10);
  std::vector<Case> all = cases();
  all.push_back({2, 4, 300, 300, 64, true, Padding::kRandom});   // several tiles, fast path
  all.push_back({1, 2, 257, 513, 128, false, Padding::kRandom});
  all.push_back({1, 2, 130, 70, 128, true, Padding::kWholeBatch});
  all.push_back({1, 2, 40, 200, 64, true, Padding::kRandom});    // key blocks past the last query
  all.push_back({1, 1, 100, 100, 200, true, Padding::kNone});    // general path, large head dim
  for (const Case& c : all) {
    check_against_math(c, torch::kCUDA, torch::kBFloat16, 2e-2);
    check_against_math(c, torch::kCUDA, torch::kFloat16, 5e-3);
    check_against_math(c, torch::kCUDA, torch::kFloat32, 2e-5);
    if (c.head_dim <= 128) check_against_math(c, torch::kCUDA, torch::kFloat64, 1e-10);  // float64 tiles are large
  }
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
