// Tuning: the search's first plans built and timed on the real batch, the
// fastest measured chosen, the model left as it was found.
#include "error_of.h"
#include "test_models.h"

#include "plugin/planner/search.h"
#include "plugin/profile_model.h"
#include "plugin/tune_plan.h"

#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <map>
#include <thread>

namespace conveyor {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::error_of;

// Linear layers with a batch norm among them (buffers that training moves).
torch::nn::Sequential tuned_model() {
  torch::nn::Sequential m(torch::nn::Linear(16, 32), torch::nn::Tanh(), torch::nn::BatchNorm1d(32),
                          torch::nn::Linear(32, 32), torch::nn::Tanh(), torch::nn::Linear(32, 8));
  m->to(torch::kFloat64);
  return m;
}

struct Sample {
  at::Tensor x = torch::randn({32, 16}, torch::kFloat64), y = torch::randn({32, 8}, torch::kFloat64);
};

const TensorsLossFn kMse = [](const Tensors& out, const Tensors& t) { return torch::mse_loss(out[0], t[0]); };

PlanSpace two_worker_space() {
  PlanSpace space;
  space.max_workers = 2;
  space.schedules = {"gpipe", "1f1b"};
  space.microbatches = {1, 2, 4, 8};
  return space;
}

PlanSearch search_for(const torch::nn::Sequential& model, const PipelineOptions& options) {
  return search_plans(model, options, 32, two_worker_space());
}

PipelineOptions profiled(const torch::nn::Sequential& model, const Sample& s) {
  return PipelineOptions().profile(std::make_shared<ModelProfile>(
      profile_model(model, s.x.narrow(0, 0, 8), s.y.narrow(0, 0, 8), testing::mse,
                    ProfileOptions().repeats(2).warmup(1).two_sizes(false))));
}

// The model, a batch, its profile and the search over two workers.
struct Searched {
  torch::nn::Sequential model = (torch::manual_seed(0), tuned_model());
  Sample s;
  PipelineOptions options = profiled(model, s);
  PlanSearch search = search_for(model, options);
};

TEST(TunePlan, MeasuresTheFirstPlansAndChoosesTheFastestMeasured) {
  const Searched searched;
  const auto& [model, s, options, search] = searched;
  ASSERT_GE(search.ranked.size(), 4u);
  // The plans with the predicted-fastest plan's micro-batch size are made
  // slow: 20 ms in every loss call, far beyond this model's step.
  const int64_t slow_size = 32 / search.best().plan.schedule.num_microbatches;
  const TensorsLossFn slowed = [slow_size](const Tensors& out, const Tensors& t) {
    if (out[0].size(0) == slow_size) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return torch::mse_loss(out[0], t[0]);
  };
  bool another_size = false;
  for (size_t i = 1; i < 4; ++i) another_size |= 32 / search.ranked[i].plan.schedule.num_microbatches != slow_size;
  ASSERT_TRUE(another_size) << search.str();
  const PlanTuning tuning = tune_plan(model, search, options, {s.x}, {s.y}, slowed, TuneOptions().finalists(4));
  SCOPED_TRACE(tuning.str());
  ASSERT_EQ(tuning.finalists.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const TunedPlan& f = tuning.finalists[i];
    EXPECT_EQ(f.choice.describe(), search.ranked[i].describe());
    EXPECT_EQ(f.predicted_seconds, search.ranked[i].plan.step_seconds());
    EXPECT_TRUE(f.error.empty()) << f.error;
    EXPECT_EQ(f.step_seconds.size(), 4u);  // 2 rounds x 2 steps
    EXPECT_GE(f.measured_seconds(), tuning.finalists[tuning.best_index].measured_seconds());
  }
  const PlanChoice& best = tuning.best();
  EXPECT_NE(32 / best.plan.schedule.num_microbatches, slow_size) << best.describe();
  EXPECT_THAT(tuning.str(), HasSubstr("* " + best.describe() + ": predicted"));
}

TEST(TunePlan, LeavesTheModelAsItFoundItAndTheChosenPlanTrainsExactly) {
  torch::manual_seed(0);
  auto model = tuned_model();
  const Sample s;
  testing::mse(model->forward(s.x), s.y).backward();  // gradients the tuning must keep
  auto reference = testing::clone_of(model);
  std::map<std::string, at::Tensor> grads;
  for (const auto& item : model->named_parameters()) grads[item.key()] = item.value().grad().clone();
  // Two plans per round with the pipeline's own optimizer: it steps the weights.
  const PipelineOptions options = profiled(model, s).optimizer(testing::sgd(0.1));
  const PlanSearch search = search_for(model, options);
  const at::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
  const PlanTuning tuning = tune_plan(model, search, options, {s.x}, {s.y}, kMse, TuneOptions().finalists(2));
  EXPECT_TRUE(at::equal(rng, at::detail::getDefaultCPUGenerator().get_state()));
  const auto got = model->named_parameters();
  for (const auto& item : reference->named_parameters()) {
    EXPECT_TRUE(at::equal(got[item.key()], item.value())) << item.key();
    EXPECT_TRUE(at::equal(got[item.key()].grad(), grads.at(item.key()))) << item.key();
  }
  const auto buffers = model->named_buffers();
  for (const auto& item : reference->named_buffers()) {
    EXPECT_TRUE(at::equal(buffers[item.key()], item.value())) << item.key();
  }

  // The chosen plan, built on the tuned model, trains as the unsplit model.
  for (const auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
  for (const auto& p : reference->parameters()) p.mutable_grad() = at::Tensor();
  Pipeline pipe(model, tuning.best().options(profiled(model, s)));
  const int m = pipe.schedule().num_microbatches;
  pipe.train_step(s.x, s.y, testing::mse);
  reference->train();
  for (int k = 0; k < m; ++k) {  // the batch norm sees each micro-batch alone, as in the pipeline
    const auto xs = s.x.tensor_split(m), ys = s.y.tensor_split(m);
    (testing::mse(reference->forward(xs[k]), ys[k]) / m).backward();
  }
  testing::expect_same_grads(pipe, reference, 1e-12, 1e-10, tuning.best().describe());
}

TEST(TunePlan, AFinalistThatFailsIsSkippedAndNamed) {
  const Searched searched;
  const auto& [model, s, options, search] = searched;
  const int64_t failing = 32 / search.best().plan.schedule.num_microbatches;
  const TensorsLossFn picky = [failing](const Tensors& out, const Tensors& t) {
    if (out[0].size(0) == failing) throw std::runtime_error("no micro-batches of " + std::to_string(failing));
    return torch::mse_loss(out[0], t[0]);
  };
  const PlanTuning tuning = tune_plan(model, search, options, {s.x}, {s.y}, picky, TuneOptions().finalists(4));
  SCOPED_TRACE(tuning.str());
  EXPECT_THAT(tuning.finalists.front().error, HasSubstr("no micro-batches of " + std::to_string(failing)));
  EXPECT_EQ(tuning.finalists.front().measured_seconds(), 0.0);
  EXPECT_NE(32 / tuning.best().plan.schedule.num_microbatches, failing);
  EXPECT_THAT(tuning.str(), HasSubstr("failed: "));

  const TensorsLossFn broken = [](const Tensors&, const Tensors&) -> at::Tensor {
    throw std::runtime_error("the loss is broken");
  };
  EXPECT_THAT(error_of([&] { tune_plan(model, search, options, {s.x}, {s.y}, broken); }),
              AllOf(HasSubstr("every finalist failed"), HasSubstr("the loss is broken")));
  EXPECT_THAT(testing::invalid_argument_of(
                  [&] { tune_plan(model, search, options, {s.x}, {s.y}, kMse, TuneOptions().steps(0)); }),
              HasSubstr("finalists, steps and rounds must be positive"));
  EXPECT_THAT(testing::invalid_argument_of([&] { tune_plan(model, PlanSearch{}, options, {s.x}, {s.y}, kMse); }),
              HasSubstr("the search found no plan to measure"));
  // Nothing failed to leave behind: the weights still train.
  for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
}

}  // namespace
}  // namespace conveyor
