// conveyor::fused_attention against a float64 math reference written out here
// and against at::scaled_dot_product_attention (the modules built on it are
// tested in test_fused_attention_modules.cpp). CUDA cases skip without a device.

#include "fused_attention_testing.h"
#include "ops/fused_attention/fused_attention.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <string>
#include <vector>

namespace conveyor {
namespace {

// These tests exercise the fused kernels themselves: every call runs them,
// whatever the dispatch table would choose (gtest_discover_tests runs each
// test in its own process, so this holds for every test of the binary;
// test_fused_attention_dispatch.cpp tests the table's choices).
const conveyor::ScopedDispatch kFusedKernelsUnderTest{conveyor::DispatchPolicy::kFused};


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
  const Result got =
      run([&](auto& a, auto& b, auto& d) { return fused_attention(a, b, d, optional_mask(mask_on_device), c.causal); },
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
      {2, 3, 17, 17, 64, false, Padding::kNone},       {1, 2, 1, 1, 64, false, Padding::kNone},  // T = 1
      {2, 2, 1, 9, 128, false, Padding::kRandom},   // one query, several keys
      {2, 2, 13, 29, 128, true, Padding::kRandom},  // S_q < S_k, causal, padded
      {2, 2, 31, 9, 40, true, Padding::kNone},      // S_q > S_k: rows past S_k see every key
      {1, 3, 70, 70, 40, true, Padding::kRandom},   // spans several CUDA tiles
      {2, 1, 21, 19, 64, false, Padding::kWholeBatch}, {2, 2, 11, 11, 40, true, Padding::kFirstKey},
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
      const Result got =
          run([&](auto& a, auto& b, auto& d) { return fused_attention(a, b, d, optional_mask(padding), c.causal); }, q,
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
  expect_error([&] { fused_attention(q.flatten(0, 1), k, v); },
               "q must be a 4-D tensor [batch, heads, seq_len, "
               "head_dim], got a 3-D tensor of shape [6, 5, 64]");
  expect_error([&] { fused_attention(q, torch::randn({2, 3, 7, 32}), v); }, "k has head_dim (dim 3) 32 but q has 64");
  expect_error([&] { fused_attention(q, k, torch::randn({2, 3, 6, 64})); }, "v has seq_len (dim 2) 6 but k has 7");
  expect_error([&] { fused_attention(q, torch::randn({2, 4, 7, 64}), v); }, "k has heads (dim 1) 4 but q has 3");
  expect_error(
      [&] {
        fused_attention(q, k, v, torch::zeros({2, 6}, torch::kBool));
      },
      "key_padding_mask must have shape [batch=2, k_len=7], got [2, 6]");
  expect_error([&] { fused_attention(q, k, v, torch::zeros({2, 7})); }, "key_padding_mask must be a bool tensor");
  expect_error([&] { fused_attention(q.to(torch::kDouble), k, v); },
               "k has dtype Float but q has dtype Double; q, k and v must share one dtype");
  expect_error([&] { fused_attention(q.to(torch::kInt), k.to(torch::kInt), v.to(torch::kInt)); },
               "q has dtype Int; supported are Float, Double, Half and BFloat16");
}

TEST(FusedAttentionCuda, MatchesMathReferenceOnDevice) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(10);
  std::vector<Case> all = cases();
  all.push_back({2, 4, 300, 300, 64, true, Padding::kRandom});  // several tiles, fast path
  all.push_back({1, 2, 257, 513, 128, false, Padding::kRandom});
  all.push_back({1, 2, 130, 70, 128, true, Padding::kWholeBatch});
  all.push_back({1, 2, 40, 200, 64, true, Padding::kRandom});  // key blocks past the last query
  all.push_back({1, 1, 100, 100, 200, true, Padding::kNone});  // general path, large head dim
  // The tolerances rest on the host emulation of these kernels at the largest
  // of these shapes (check_attention_kernels large, one head each): at most
  // 5.8e-4 (float16), 4.3e-3 (bfloat16) and 6.2e-7 (float32, head_dim 200)
  // of the reference's scale, over output and gradients. The 16-bit calls run
  // every tensor-core kernel in turn.
  for (const auto& kernel : fused_kernel_names("attention")) {
    const ScopedFusedKernel only("attention", kernel);
    for (const Case& c : all) {
      check_against_math(c, torch::kCUDA, torch::kBFloat16, 2e-2);
      check_against_math(c, torch::kCUDA, torch::kFloat16, 5e-3);
    }
  }
  for (const Case& c : all) {
    check_against_math(c, torch::kCUDA, torch::kFloat32, 2e-5);
    if (c.head_dim <= 128) check_against_math(c, torch::kCUDA, torch::kFloat64, 1e-10);  // float64 tiles are large
  }
}

// A softmax scale of 0 or below (tiles128 takes row maxima of raw scores,
// which needs scale > 0: such calls run v1) gives the reference's result
// whichever kernel is named.
TEST(FusedAttentionCuda, AScaleOfZeroOrBelowMatchesWhateverTheKernel) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(13);
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const at::Tensor q = torch::randn({1, 2, 70, 64}, opts), k = torch::randn({1, 2, 90, 64}, opts),
                   v = torch::randn({1, 2, 90, 64}, opts);
  const at::Tensor hidden = torch::zeros({1, 1, 70, 90}, torch::kBool);
  for (const auto& kernel : fused_kernel_names("attention")) {
    const ScopedFusedKernel only("attention", kernel);
    for (const double scale : {0.0, -0.3}) {
      const at::Tensor want = math_attention(q.cpu().to(torch::kDouble), k.cpu().to(torch::kDouble),
                                             v.cpu().to(torch::kDouble), hidden, scale);
      EXPECT_LE(relative_error(fused_attention(q, k, v, std::nullopt, false, scale).cpu().to(torch::kDouble), want),
                2e-2)
          << kernel << " scale " << scale;
    }
  }
}

// Views that start 2 bytes into their storage (x[1:] of a half tensor, flat)
// cannot take the tensor-core kernels' 16-byte copies: they run the general
// kernels and still match (ops/fused_attention/cuda/attention_kernels.h).
TEST(FusedAttentionCuda, MisalignedViewsTakeTheGeneralKernels) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(12);
  const std::vector<int64_t> shape{2, 2, 40, 64};
  const int64_t n = 2 * 2 * 40 * 64;
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kHalf);
  auto misaligned = [&] { return torch::randn({n + 1}, opts).narrow(0, 1, n).view(shape); };
  const at::Tensor q = misaligned(), k = misaligned(), v = misaligned();
  ASSERT_TRUE(q.is_contiguous());
  ASSERT_NE(reinterpret_cast<uintptr_t>(q.data_ptr()) % 16, 0u);
  const at::Tensor hidden = torch::zeros({2, 1, 40, 40}, torch::kBool);
  const at::Tensor want = math_attention(q.cpu().to(torch::kDouble), k.cpu().to(torch::kDouble),
                                         v.cpu().to(torch::kDouble), hidden, 1.0 / 8);
  EXPECT_LE(relative_error(fused_attention(q, k, v).cpu().to(torch::kDouble), want), 5e-3);
}

}  // namespace
}  // namespace conveyor
