// conveyor::fused_lstm, conveyor::FusedLSTM and swap_fused_ops against
// torch::nn::LSTM with the same weights: values and every gradient (the swap
// is tested in test_fused_lstm_swap.cpp).

#include "fused_lstm_testing.h"
#include "ops/fused_lstm/fused_lstm.h"
#include "ops/fused_lstm/fused_lstm_module.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <random>
#include <sstream>
#include <string>

namespace {

// These tests exercise the fused kernels themselves: every call runs them,
// whatever the dispatch table would choose (gtest_discover_tests runs each
// test in its own process, so this holds for every test of the binary;
// test_fused_lstm_dispatch.cpp tests the table's choices).
const conveyor::ScopedDispatch kFusedKernelsUnderTest{conveyor::DispatchPolicy::kFused};


using conveyor::FusedLSTM;
using conveyor::FusedLSTMImpl;
using ::testing::HasSubstr;
using torch::nn::LSTM;
using torch::nn::LSTMOptions;
using State = std::optional<std::tuple<at::Tensor, at::Tensor>>;
using LstmResult = std::tuple<at::Tensor, std::tuple<at::Tensor, at::Tensor>>;
using ForwardFn = std::function<LstmResult(const at::Tensor&, const State&)>;
using conveyor::testing::copy_parameters;
using conveyor::testing::expect_close;

struct Config {
  int64_t seq_len, batch, input_size, hidden, layers;
  bool batch_first, bias, given_state;
  std::string str() const {
    std::ostringstream s;
    s << "T=" << seq_len << " B=" << batch << " I=" << input_size << " H=" << hidden << " L=" << layers
      << " batch_first=" << batch_first << " bias=" << bias << " given_state=" << given_state;
    return s.str();
  }
  LSTMOptions options() const {
    return LSTMOptions(input_size, hidden).num_layers(layers).bias(bias).batch_first(batch_first);
  }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "<no error>";
}

// Runs both modules on the same data, backpropagates a random weighting of
// (output, h_n, c_n) and compares values, input/state gradients and every
// parameter gradient.
void expect_same_as_torch(torch::nn::Module& fused_module, LSTM& ref, const Config& c, torch::Dtype dtype,
                          torch::Device device, double tol, bool relative, const std::string& where,
                          const ForwardFn& fused_forward) {
  const auto opts = torch::TensorOptions().dtype(dtype).device(device);
  const int64_t dim0 = c.batch_first ? c.batch : c.seq_len;
  const int64_t dim1 = c.batch_first ? c.seq_len : c.batch;
  const at::Tensor x = torch::randn({dim0, dim1, c.input_size}, opts);
  const at::Tensor h0 = torch::randn({c.layers, c.batch, c.hidden}, opts);
  const at::Tensor c0 = torch::randn({c.layers, c.batch, c.hidden}, opts);
  const at::Tensor w_out = torch::randn({dim0, dim1, c.hidden}, opts);
  const at::Tensor w_h = torch::randn({c.layers, c.batch, c.hidden}, opts);
  const at::Tensor w_c = torch::randn({c.layers, c.batch, c.hidden}, opts);

  auto run = [&](auto&& forward) {
    at::Tensor xi = x.clone().requires_grad_();
    at::Tensor hi = h0.clone().requires_grad_();
    at::Tensor ci = c0.clone().requires_grad_();
    State state;
    if (c.given_state) state = std::make_tuple(hi, ci);
    auto [out, hc] = forward(xi, state);
    auto [h_n, c_n] = hc;
    ((out * w_out).sum() + (h_n * w_h).sum() + (c_n * w_c).sum()).backward();
    return std::vector<at::Tensor>{out, h_n, c_n, xi.grad(), hi.grad(), ci.grad()};
  };
  const auto got = run(fused_forward);
  const auto want = run([&](const at::Tensor& xi, const State& s) { return ref->forward(xi, s); });
  const char* names[] = {"output", "h_n", "c_n", "grad input", "grad h0", "grad c0"};
  const size_t n = c.given_state ? 6 : 4;
  for (size_t k = 0; k < n; ++k) expect_close(got[k], want[k], tol, relative, where + " " + names[k]);

  const auto ref_params = ref->named_parameters();
  for (const auto& p : fused_module.named_parameters()) {
    expect_close(p.value().grad(), ref_params[p.key()].grad(), tol, relative, where + " grad " + p.key());
  }
}

void expect_module_matches(const Config& c, torch::Dtype dtype, double tol, bool relative) {
  LSTM ref(c.options());
  FusedLSTM fused(c.options());
  copy_parameters(*ref, *fused);
  ref->to(dtype);
  fused->to(dtype);
  expect_same_as_torch(*fused, ref, c, dtype, torch::kCPU, tol, relative, c.str() + " " + c10::toString(dtype),
                       [&](const at::Tensor& x, const State& s) { return fused->forward(x, s); });
}

std::vector<Config> test_configs() {
  std::vector<Config> configs{
      {5, 3, 4, 7, 1, false, true, false},   {1, 1, 3, 33, 2, true, true, true}, {4, 2, 5, 7, 4, true, false, true},
      {3, 1, 2, 33, 3, false, false, false}, {1, 4, 6, 5, 1, false, true, true},
  };
  std::mt19937 rng(20240611);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int k = 0; k < 5; ++k) {
    configs.push_back({pick(1, 6), pick(1, 4), pick(1, 9), pick(1, 40), pick(1, 4), pick(0, 1) == 1, pick(0, 1) == 1,
                       pick(0, 1) == 1});
  }
  return configs;
}

TEST(FusedLstm, MatchesTorchLstmInFloat64) {
  torch::manual_seed(1);
  for (const auto& c : test_configs()) expect_module_matches(c, torch::kFloat64, 1e-10, /*relative=*/false);
}

// oneDNN's CPU LSTM builds a kernel per shape (seconds for this test); the
// reference runs torch's native CPU LSTM, the same arithmetic, instead.
struct WithoutMkldnn {
  WithoutMkldnn() : was(at::globalContext().userEnabledMkldnn()) { at::globalContext().setUserEnabledMkldnn(false); }
  ~WithoutMkldnn() { at::globalContext().setUserEnabledMkldnn(was); }
  bool was;
};

TEST(FusedLstm, MatchesTorchLstmInFloat32) {
  const WithoutMkldnn native_reference;
  torch::manual_seed(2);
  for (const auto& c : test_configs()) expect_module_matches(c, torch::kFloat32, 1e-5, /*relative=*/true);
}

TEST(FusedLstm, CpuComputesHalfTypesInFloat) {
  // bfloat16 / float16 in and out, computed in float32: the result is the
  // float32 result on the same (rounded) values, rounded once.
  torch::manual_seed(3);
  for (const auto dtype : {torch::kBFloat16, torch::kHalf}) {
    FusedLSTM fused(LSTMOptions(4, 9).num_layers(2));
    fused->to(dtype);
    const at::Tensor x = torch::randn({5, 3, 4}).to(dtype).requires_grad_();
    const auto [out, state] = fused->forward(x);
    std::vector<at::Tensor> float_weights;
    for (const auto& w : fused->flat_weights()) float_weights.push_back(w.detach().to(torch::kFloat));
    const at::Tensor zeros = torch::zeros({2, 3, 9});
    const at::Tensor x_float = x.detach().to(torch::kFloat);
    const auto want = std::get<0>(conveyor::fused_lstm(x_float, zeros, zeros, float_weights, true));
    EXPECT_EQ(out.scalar_type(), dtype);
    expect_close(out, want, 1e-2, /*relative=*/true, std::string("output ") + c10::toString(dtype));
    out.sum().backward();
    ASSERT_TRUE(x.grad().defined());
    EXPECT_EQ(x.grad().scalar_type(), dtype);
    EXPECT_EQ(fused->named_parameters()["weight_hh_l1"].grad().scalar_type(), dtype);
  }
}

TEST(FusedLstm, DropoutBetweenLayersLikeTorch) {
  torch::manual_seed(4);
  const Config c{6, 3, 4, 7, 3, true, true, true};
  for (double p : {0.0, 0.5, 1.0}) {
    LSTM ref(c.options().dropout(p));
    FusedLSTM fused(c.options().dropout(p));
    copy_parameters(*ref, *fused);
    ref->to(torch::kFloat64);
    fused->to(torch::kFloat64);
    auto forward = [&](const at::Tensor& x, const State& s) { return fused->forward(x, s); };
    // Eval: dropout is off in both. Training with p = 0 or p = 1 is deterministic
    // (keep all / drop all between layers) and must match too.
    ref->eval();
    fused->eval();
    const std::string where = "p=" + std::to_string(p);
    expect_same_as_torch(*fused, ref, c, torch::kFloat64, torch::kCPU, 1e-10, false, "eval " + where, forward);
    if (p == 0.5) continue;
    ref->train();
    fused->train();
    fused->zero_grad();
    ref->zero_grad();
    expect_same_as_torch(*fused, ref, c, torch::kFloat64, torch::kCPU, 1e-10, false, "train " + where, forward);
  }
  // With 0 < p < 1 training must actually drop something.
  FusedLSTM fused(c.options().dropout(0.5));
  const at::Tensor x = torch::randn({3, 6, 4});
  fused->eval();
  const auto eval_out = std::get<0>(fused->forward(x));
  fused->train();
  const auto train_out = std::get<0>(fused->forward(x));
  EXPECT_GT((train_out - eval_out).abs().max().item<double>(), 1e-3);
}

TEST(FusedLstm, StateDictRoundTrip) {
  torch::manual_seed(5);
  const auto options = LSTMOptions(5, 7).num_layers(2);
  LSTM original(options);
  FusedLSTM fused(options);
  LSTM back(options);
  std::vector<std::string> names, fused_names;
  for (const auto& p : original->named_parameters()) names.push_back(p.key());
  for (const auto& p : fused->named_parameters()) fused_names.push_back(p.key());
  EXPECT_EQ(fused_names, names);

  std::stringstream to_fused, to_back;
  torch::save(original, to_fused);
  torch::load(fused, to_fused);
  torch::save(fused, to_back);
  torch::load(back, to_back);
  const auto want = original->named_parameters();
  for (const auto& p : back->named_parameters()) {
    EXPECT_TRUE(torch::equal(p.value(), want[p.key()])) << p.key();
    EXPECT_TRUE(torch::equal(fused->named_parameters()[p.key()], want[p.key()])) << p.key();
  }
  copy_parameters(*fused, *back);  // by name, without serialisation
  const at::Tensor x = torch::randn({4, 2, 5});
  EXPECT_TRUE(torch::allclose(std::get<0>(back->forward(x)), std::get<0>(original->forward(x))));
  expect_close(std::get<0>(fused->forward(x)), std::get<0>(original->forward(x)), 1e-5, true, "fused output");
  // Unbatched [seq_len, input_size] input, which libtorch's LSTM lacks (Python's has it).
  const at::Tensor unbatched = torch::randn({4, 5});
  const at::Tensor want_unbatched = std::get<0>(original->forward(unbatched.unsqueeze(1))).squeeze(1);
  expect_close(std::get<0>(fused->forward(unbatched)), want_unbatched, 1e-5, true, "unbatched output");
}

TEST(FusedLstm, RejectsBadInputWithClearMessages) {
  FusedLSTM fused(LSTMOptions(4, 6).num_layers(2));
  EXPECT_THAT(error_of([&] { fused->forward(torch::randn({2, 3, 4, 1})); }), HasSubstr("input must be 3-D"));
  EXPECT_THAT(error_of([&] {
                fused->forward(torch::randn({5, 3, 5}));
              }),
              HasSubstr("input feature size (input dim 2) is 5 but weight_ih_l0 expects 4"));
  const State wrong_h0 = std::make_tuple(torch::zeros({2, 2, 6}), torch::zeros({2, 3, 6}));
  EXPECT_THAT(error_of([&] {
                fused->forward(torch::randn({5, 3, 4}), wrong_h0);
              }),
              HasSubstr("h0 must have shape [num_layers, batch, hidden_size] = [2, 3, 6], got [2, 2, 6]"));
  EXPECT_THAT(error_of([&] {
                fused->forward(torch::randn({5, 3, 4}, torch::kFloat64));
              }),
              HasSubstr("weight_ih_l0 has dtype Float but input has dtype Double"));
  EXPECT_THAT(error_of([&] { FusedLSTM(LSTMOptions(4, 6).bidirectional(true)); }), HasSubstr("bidirectional"));
  EXPECT_THAT(error_of([&] { FusedLSTM(LSTMOptions(4, 6).proj_size(3)); }), HasSubstr("proj_size=3"));

  // The op itself: rank and the weight list.
  const auto w = fused->flat_weights();
  const at::Tensor state = torch::zeros({2, 3, 6});
  EXPECT_THAT(error_of([&] {
                conveyor::fused_lstm(torch::randn({3, 4}), state, state, w, true);
              }),
              HasSubstr("input must be 3-D [seq_len, batch, input_size], got a 2-D tensor"));
  const at::TensorList three_weights = at::TensorList(w).slice(0, 3);
  EXPECT_THAT(error_of([&] {
                conveyor::fused_lstm(torch::randn({5, 3, 4}), state, state, three_weights, true);
              }),
              HasSubstr("weights must hold 4 tensors per layer"));
}

// PyTorch's TF32 setting for cuDNN (the fused kernels follow its RNN part:
// conveyor::lstm_allows_tf32), set for a scope.
class ScopedRnnTf32 {
 public:
  explicit ScopedRnnTf32(bool allow) : before_(conveyor::lstm_allows_tf32()) {
    at::globalContext().setAllowTF32CuDNN(allow);
    EXPECT_EQ(conveyor::lstm_allows_tf32(), allow);
  }
  ~ScopedRnnTf32() { at::globalContext().setAllowTF32CuDNN(before_); }

 private:
  bool before_;
};

TEST(FusedLstmCuda, EveryKernelMatchesTorchLstmOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  // The reference is torch::nn::LSTM on CUDA in float64, with the same
  // (dtype-rounded) weights. Each kernel runs every config (where a
  // persistent kernel does not fit, the per-step kernels run instead).
  const std::vector<Config> configs{{7, 4, 5, 33, 2, true, true, true},
                                    {5, 48, 6, 40, 2, false, true, false},
                                    {1, 1, 3, 7, 1, false, false, true},
                                    {9, 16, 64, 600, 1, false, true, true}};
  struct Precision {
    torch::Dtype dtype;
    bool tf32;
    double tol;  // the host emulation's errors (check_lstm_kernels) times a margin
  };
  const std::vector<Precision> precisions{
      {torch::kFloat32, false, 1e-5}, {torch::kFloat32, true, 5e-3}, {torch::kBFloat16, false, 2e-2},
      {torch::kHalf, false, 1e-2}};
  for (const auto& kernel : conveyor::fused_kernel_names("lstm")) {
    const conveyor::ScopedFusedKernel only("lstm", kernel);
    for (const auto& [dtype, tf32, tol] : precisions) {
      const ScopedRnnTf32 tf32_setting(tf32);
      for (const auto& c : configs) {
        torch::manual_seed(9);
        LSTM ref(c.options());
        FusedLSTM fused(c.options());
        fused->to(torch::kCUDA, dtype);
        copy_parameters(*fused, *ref);
        ref->to(torch::kCUDA, torch::kFloat64);
        const auto where = c.str() + " cuda " + c10::toString(dtype) + (tf32 ? " tf32" : "") + " kernel " + kernel;
        expect_same_as_torch(*fused, ref, c, torch::kFloat64, torch::kCUDA, tol, true, where,
                             [&](const at::Tensor& x, const State& s) {
                               State sd;
                               if (s) sd = std::make_tuple(std::get<0>(*s).to(dtype), std::get<1>(*s).to(dtype));
                               auto [out, hc] = fused->forward(x.to(dtype), sd);
                               return LstmResult{out, hc};
                             });
      }
    }
  }
}

}  // namespace
