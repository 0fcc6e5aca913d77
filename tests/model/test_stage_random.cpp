// Per-stage random streams (PipelineOptions::stage_rng) with two pipelines in
// one process: each trains in its own thread at the same time as the other,
// and each run equals, bit for bit, the same pipeline trained alone.
#include "plugin/conveyor.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>
#include <vector>

namespace conveyor {
namespace {

struct TrainingRun {
  std::vector<double> losses;
  std::vector<at::Tensor> weights;
};

// A pipeline with dropout in both stages, its own streams seeded from `seed`.
std::unique_ptr<StageRunner> make_pipeline(uint64_t seed, const char* schedule) {
  torch::manual_seed(seed);
  torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::Dropout(0.5), torch::nn::Tanh(),
                              torch::nn::Linear(16, 16), torch::nn::Dropout(0.3), torch::nn::Linear(16, 1));
  model->to(torch::kFloat64);
  return std::make_unique<StageRunner>(
      model, PipelineOptions().workers(2).microbatches(4).schedule(schedule).stage_rng(true).optimizer(
                 [](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, 0.05); }));
}

TrainingRun train(StageRunner& pipe, uint64_t data_seed, int steps) {
  const auto g = at::detail::createCPUGenerator(data_seed);
  const at::Tensor x = at::randn({32, 8}, g, at::kDouble);
  const at::Tensor y = at::randn({32, 1}, g, at::kDouble);
  TrainingRun run;
  for (int step = 0; step < steps; ++step) {
    run.losses.push_back(
        pipe.train_step(x, y, [](const at::Tensor& out, const at::Tensor& t) { return torch::mse_loss(out, t); })
            .loss);
  }
  for (const auto& p : pipe.parameters()) run.weights.push_back(p.detach().clone());
  return run;
}

void expect_same(const TrainingRun& a, const TrainingRun& b) {
  ASSERT_EQ(a.losses, b.losses);
  ASSERT_EQ(a.weights.size(), b.weights.size());
  for (size_t i = 0; i < a.weights.size(); ++i) EXPECT_TRUE(torch::equal(a.weights[i], b.weights[i])) << i;
}

TEST(StageRandom, TwoPipelinesTrainingAtOnceEachEqualTheirOwnRunAlone) {
  constexpr int kSteps = 12;
  const TrainingRun alone_a = train(*make_pipeline(1, "1f1b"), 10, kSteps);
  const TrainingRun alone_b = train(*make_pipeline(2, "gpipe"), 20, kSteps);
  ASSERT_NE(alone_a.losses, alone_b.losses);  // two different runs, not one twice

  auto a = make_pipeline(1, "1f1b");
  auto b = make_pipeline(2, "gpipe");
  TrainingRun together_a, together_b;
  std::thread ta([&] { together_a = train(*a, 10, kSteps); });
  std::thread tb([&] { together_b = train(*b, 20, kSteps); });
  ta.join();
  tb.join();
  expect_same(together_a, alone_a);
  expect_same(together_b, alone_b);
}

}  // namespace
}  // namespace conveyor
