#pragma once
// The TorchScript fixtures that tests/python/make_fixtures.py writes before
// the tests run (ctest passes their folder in CONVEYOR_FIXTURES).

#include "built_pipeline.h"
#include "plugin/script/torchscript.h"
#include "test_models.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace conveyor::testing {

// The path of fixture `name`, or "" without CONVEYOR_FIXTURES.
inline std::string fixture(const std::string& name) {
  const char* dir = std::getenv("CONVEYOR_FIXTURES");
  return dir ? (std::filesystem::path(dir) / name).string() : std::string();
}

// The losses the fixtures' tests train with: mean squared error, and a
// language model's cross-entropy, of the first output and target.
inline at::Tensor mse_of(const Tensors& out, const Tensors& target) { return torch::mse_loss(out[0], target[0]); }
inline at::Tensor cross_entropy_of(const Tensors& out, const Tensors& target) {
  return lm_loss(out[0], target[0]);
}

// Every pipeline gradient equals the reference's, matched by the model's names.
inline void expect_same_grads(const StageRunner& pipe, const torch::jit::Module& ref, double tol,
                              const std::string& where) {
  std::map<std::string, at::Tensor> expected;
  for (const auto& p : ref.named_parameters()) expected[p.name] = p.value;
  const auto got = model_named_parameters(pipe);
  ASSERT_EQ(got.size(), expected.size()) << where;
  for (const auto& [name, p] : got) {
    ASSERT_EQ(expected.count(name), 1u) << where << ": the model has no parameter " << name;
    const at::Tensor& r = expected[name];
    ASSERT_TRUE(p.grad().defined()) << where << ": no gradient for " << name;
    ASSERT_TRUE(r.grad().defined()) << where << ": no reference gradient for " << name;
    EXPECT_LE((p.grad() - r.grad()).abs().max().item<double>(), tol) << where << ": gradient of " << name;
  }
}

// One step of the pipeline cut at `split_points` against the unsplit model's
// own backward (a second load of fixture `file`): every gradient, matched by
// the model's names, and the loss, to 1e-10.
inline void check_exact(const std::string& file, const Tensors& inputs, const Tensors& targets,
                        const TensorsLossFn& loss, const std::vector<std::string>& split_points,
                        const PipelineOptions& options, const std::string& where) {
  torch::jit::Module ref = load_script(fixture(file));
  const at::Tensor ref_loss = loss({ref.forward(std::vector<c10::IValue>(inputs.begin(), inputs.end())).toTensor()},
                                   targets);
  ref_loss.backward();
  const auto pipe = testing::built_pipeline(load_script(fixture(file)), options, split_points);
  ASSERT_EQ(pipe->num_stages(), static_cast<int>(split_points.size()) + 1) << where;
  const StepResult r = pipe->train_step(inputs, targets, loss);
  expect_same_grads(*pipe, ref, 1e-10, where);
  EXPECT_NEAR(r.loss, ref_loss.item<double>(), 1e-10) << where;
}

}  // namespace conveyor::testing

// Skips the test when the fixtures were not made (the binary run by hand).
#define REQUIRE_FIXTURES()                                                              \
  if (!std::getenv("CONVEYOR_FIXTURES")) {                                              \
    GTEST_SKIP() << "CONVEYOR_FIXTURES is not set (ctest runs make_fixtures.py first)"; \
  }
