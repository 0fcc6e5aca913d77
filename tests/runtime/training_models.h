#pragma once
// What the training-option tests share: a model deep enough for 4 workers of
// 2 chunks, and the check that a pipeline's weights equal the unsplit
// reference model's.

#include "plugin/runner/stage_runner.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <string>

namespace conveyor::testing {

inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline const char* const kSynchronous[] = {"sequential",  "gpipe", "1f1b", "eager-1f1b",
                                           "interleaved", "zb-h1", "zb-interleaved"};

// 16 layers: K = 4 with 2 chunks per worker still gets 2 layers a stage.
inline torch::nn::Sequential deep_mlp(torch::Dtype dtype = torch::kFloat64) {
  torch::nn::Sequential m;
  m->push_back(torch::nn::Linear(8, 16));
  for (int i = 0; i < 6; ++i) {
    m->push_back(torch::nn::Tanh());
    m->push_back(torch::nn::Linear(16, 16));
  }
  m->push_back(torch::nn::Tanh());
  m->push_back(torch::nn::Linear(16, 3));
  m->to(dtype);
  return m;
}

inline void expect_same_values(const StageRunner& pipe, const torch::nn::Sequential& reference, double tol,
                               const std::string& where) {
  const auto ref = reference->named_parameters();
  for (const auto& [name, p] : pipe.named_parameters()) {
    const at::Tensor* r = ref.find(name);
    ASSERT_NE(r, nullptr) << where << ": " << name;
    EXPECT_LE((p - *r).abs().max().item<double>(), tol) << where << ": " << name;
  }
}

}  // namespace conveyor::testing
