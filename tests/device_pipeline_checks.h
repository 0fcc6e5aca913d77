#pragma once
// The checks a model with swapped fused ops passes when its pipeline runs on
// a GPU: several workers on one device, each computing on a stream of its
// own. On a machine without CUDA they run on the CPU (the same checks, so
// that they cannot rot between GPU runs); CONVEYOR_REQUIRE_CUDA=1 (set by
// scripts/gpu.sh) makes a missing device a failure instead.
//   - exact: under each synchronous schedule, float64 gradients and loss
//     equal the unsplit model's on the same device within 1e-10;
//   - caller's optimizer: 5 train_steps with a torch::optim::Adam the caller
//     steps between them with no synchronisation leave the same weights as
//     the same run on the CPU (1e-9), repeated to catch races;
//   - asynchronous (pipedream, the pipeline's own optimizer): the same.
#include "ops/dispatch/fused_dispatch.h"
#include "test_models.h"

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace conveyor::testing {

// The fixture of these checks: the fused kernels for every call (the dispatch
// table would send most calls to cuDNN and SDPA).
class FusedKernelsEverywhere : public ::testing::Test {
  ScopedDispatch fused_{DispatchPolicy::kFused};
};

inline torch::Device pipeline_test_device() {
  if (torch::cuda::is_available()) return torch::Device(torch::kCUDA, 0);
  const char* required = std::getenv("CONVEYOR_REQUIRE_CUDA");
  if (required && std::string(required) == "1") {
    ADD_FAILURE() << "CONVEYOR_REQUIRE_CUDA=1 but torch sees no CUDA device";
  }
  return torch::Device(torch::kCPU);
}

struct DevicePipelineModel {
  std::function<torch::nn::Sequential()> make;  // float64, on the CPU, fused ops swapped in
  at::Tensor input, target;                     // on the CPU
  LossFn loss;
  int64_t batch_dim = 0;
};

inline void move_to(torch::nn::Sequential& model, const torch::Device& device) { model->to(device, torch::kFloat64); }

inline void expect_same_parameters(const StageRunner& got, const StageRunner& want, double tol, const std::string& where) {
  const auto a = got.named_parameters();
  const auto b = want.named_parameters();
  ASSERT_EQ(a.size(), b.size()) << where;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].first, b[i].first) << where;
    const double diff = (a[i].second.detach().cpu() - b[i].second.detach().cpu()).abs().max().item<double>();
    EXPECT_LE(diff, tol) << where << ": " << a[i].first << " differs by " << diff;
  }
}

// Exact gradients under each synchronous schedule with 2 to max_workers
// workers on `device` (interleaved: 2 workers of 2 chunks).
inline void check_exact_gradients(const DevicePipelineModel& m, const torch::Device& device, int max_workers) {
  for (const char* schedule : {"gpipe", "1f1b", "interleaved", "zb-h1"}) {
    const bool interleaved = std::string(schedule) == "interleaved";
    for (int k = 2; k <= (interleaved ? 2 : max_workers); ++k) {
      const std::string where = std::string(schedule) + " K=" + std::to_string(k) + " on " + device.str();
      torch::manual_seed(30 + k);
      auto model = m.make();
      auto reference = clone_of(model);
      move_to(model, device);
      move_to(reference, device);
      const at::Tensor x = m.input.to(device), y = m.target.to(device);
      const at::Tensor ref_loss = m.loss(reference->forward(x), y);
      ref_loss.backward();
      StageRunner pipe(model, PipelineOptions()
                               .workers(k)
                               .microbatches(4)
                               .batch_dim(m.batch_dim)
                               .schedule(schedule)
                               .devices({device.str()}));
      const StepResult r = pipe.train_step(x, y, m.loss);
      expect_same_grads(pipe, reference, 1e-10, 0, where);
      EXPECT_NEAR(r.loss, ref_loss.item<double>(), 1e-10) << where;
    }
  }
}

// 5 steps of `schedule` on `device`, as a user writes them: the caller's Adam
// steps right after each train_step returns, with no synchronisation (or the
// pipeline's own Adam, for an asynchronous schedule). Returns the pipeline.
inline std::unique_ptr<StageRunner> five_steps(const DevicePipelineModel& m, const torch::Device& device,
                                            const std::string& schedule, int workers) {
  torch::manual_seed(40);
  auto model = m.make();
  move_to(model, device);
  auto adam = [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-3));
  };
  const bool asynchronous = schedule == "pipedream";
  auto options = PipelineOptions()
                     .workers(workers)
                     .microbatches(4)
                     .batch_dim(m.batch_dim)
                     .schedule(schedule)
                     .devices({device.str()});
  if (asynchronous) options.optimizer(adam);
  auto pipe = std::make_unique<StageRunner>(model, options);
  std::unique_ptr<torch::optim::Optimizer> caller = asynchronous ? nullptr : adam(pipe->parameters());
  for (int step = 0; step < 5; ++step) {
    // A different batch each step, made on the CPU and moved as a user would.
    const at::Tensor x = m.input.roll(step, m.batch_dim).to(device);
    const at::Tensor y = m.target.roll(step, m.batch_dim).to(device);
    pipe->train_step(x, y, m.loss);
    if (caller) {
      caller->step();
      caller->zero_grad();
    }
  }
  return pipe;
}

inline void check_steps_match_cpu(const DevicePipelineModel& m, const torch::Device& device, int repeats) {
  const std::vector<std::pair<std::string, int>> runs = {{"1f1b", 3}, {"zb-h1", 2}, {"pipedream", 3}};
  for (const auto& [schedule, workers] : runs) {
    const auto want = five_steps(m, torch::kCPU, schedule, workers);
    for (int r = 0; r < repeats; ++r) {
      const auto got = five_steps(m, device, schedule, workers);
      expect_same_parameters(*got, *want, 1e-9,
                             schedule + " K=" + std::to_string(workers) + " on " + device.str() + ", 5 steps, run " +
                                 std::to_string(r));
    }
  }
}

}  // namespace conveyor::testing
