#pragma once
// What the fused LSTM tests share.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>

namespace conveyor::testing {

// Copies parameter values by name, the way a state dict moves between modules.
inline void copy_parameters(const torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  const auto source = from.named_parameters();
  for (auto& p : to.named_parameters()) {
    const at::Tensor* s = source.find(p.key());
    ASSERT_NE(s, nullptr) << "no parameter " << p.key() << " in the source";
    p.value().copy_(*s);
  }
}

// |got - want| <= tol (absolute) or tol * max|want| (relative).
inline void expect_close(const at::Tensor& got, const at::Tensor& want, double tol, bool relative,
                         const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << ": undefined";
  ASSERT_TRUE(want.defined()) << what << ": reference undefined";
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const auto g = got.detach().cpu().to(at::kDouble);
  const auto w = want.detach().cpu().to(at::kDouble);
  const double scale = relative ? std::max(w.abs().max().item<double>(), 1e-30) : 1.0;
  const double diff = (g - w).abs().max().item<double>();
  EXPECT_LE(diff, tol * scale) << what << ": max abs diff " << diff << " (scale " << scale << ")";
}

}  // namespace conveyor::testing
