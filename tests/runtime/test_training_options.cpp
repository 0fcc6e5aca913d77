// The training options of a real run: dynamic loss scaling and gradient
// accumulation, each against the unsplit model doing the same (GradScaler's
// rules, one step on the concatenated batch), and the errors for options that
// cannot work. Clipping: test_clipping.cpp; autocast: test_autocast.cpp.
#include "error_of.h"
#include "plugin/checkpoint/checkpoint.h"
#include "plugin/pipeline.h"
#include "reference_trainer.h"
#include "runtime/training_models.h"
#include "temp_dir.h"
#include "test_models.h"

#include <cmath>
#include <limits>
#include <memory>
#include <set>

namespace conveyor {
namespace {

using ::testing::HasSubstr;
using testing::error_of;

using testing::deep_mlp;
using testing::expect_same_values;
using testing::kInf;
using testing::sgd;

// ---------------------------------------------------------------------------
// Loss scaling.

// Linear, bomb, Tanh | Linear, Tanh, Linear: with K = 2 the bomb overflows
// stage 0's gradients only.
torch::nn::Sequential bomb_mlp(const std::shared_ptr<double>& factor) {
  torch::nn::Sequential m(torch::nn::Linear(8, 16), testing::GradBomb(factor), torch::nn::Tanh(), torch::nn::Linear(16, 16),
                          torch::nn::Tanh(), torch::nn::Linear(16, 3));
  m->to(torch::kFloat64);
  return m;
}

// torch.amp.GradScaler's rules, driving the unsplit model.
struct ReferenceScaler {
  double scale;
  int64_t interval;
  int64_t tracker = 0;
  // Returns whether the optimizer stepped.
  bool step(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& params) {
    bool found = false;
    for (const auto& p : params) found = found || !torch::isfinite(p.grad()).all().item<bool>();
    if (!found) {
      torch::NoGradGuard no_grad;
      for (const auto& p : params) p.grad().mul_(1.0 / scale);
      opt.step();
    }
    if (found) {
      scale *= 0.5;
      tracker = 0;
    } else if (++tracker == interval) {
      scale *= 2.0;
      tracker = 0;
    }
    return !found;
  }
};

TEST(LossScaling, OverflowsAtChosenStepsSkipEveryStageAsGradScalerSkipsTheUnsplitModel) {
  for (const char* schedule : {"gpipe", "1f1b", "zb-h1", "zb-v", "v-half"}) {
    const std::string where = schedule;
    torch::manual_seed(7);
    auto factor = std::make_shared<double>(1.0);
    auto model = bomb_mlp(factor);
    auto reference = testing::clone_of(model);
    StageRunner pipe(model, PipelineOptions()
                             .workers(2)
                             .microbatches(4)
                             .schedule(schedule)
                             .loss_scaling(LossScaling().init_scale(1024).growth_interval(2))
                             .optimizer(sgd(0.1, 0.9)));
    torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    ReferenceScaler scaler{1024, 2};
    const std::set<int> overflow_at = {1, 4, 5};
    for (int step = 0; step < 8; ++step) {
      const std::string at_step = where + " step " + std::to_string(step);
      *factor = overflow_at.count(step) ? kInf : 1.0;
      const at::Tensor x = torch::randn({8, 8}, torch::kFloat64);
      const at::Tensor y = torch::randn({8, 3}, torch::kFloat64);
      EXPECT_EQ(pipe.loss_scaler_state()->scale, scaler.scale) << at_step;
      const StepResult r = pipe.train_step(x, y, testing::mse);  // never raises
      EXPECT_EQ(r.loss_scale, scaler.scale) << at_step;
      ref_opt.zero_grad();
      (testing::mse(reference->forward(x), y) * scaler.scale).backward();
      const bool stepped = scaler.step(ref_opt, reference->parameters());
      EXPECT_EQ(r.stepped, stepped) << at_step;
      EXPECT_EQ(r.skipped_updates, stepped ? 0 : 1) << at_step;
      EXPECT_EQ(r.updates, std::vector<int>(static_cast<size_t>(pipe.num_stages()), 1))
          << at_step << ": a skipped update still counts";
      EXPECT_EQ(pipe.loss_scaler_state()->scale, scaler.scale) << at_step;
      EXPECT_EQ(pipe.loss_scaler_state()->growth_tracker, scaler.tracker) << at_step;
      expect_same_values(pipe, reference, 1e-10, at_step);
      for (const auto& p : pipe.parameters()) EXPECT_FALSE(p.grad().defined()) << at_step;
    }
  }
}

TEST(LossScaling, WithoutOverflowsTheScaledStepsEqualUnscaledOnesBitForBit) {
  // Power-of-two scales change no bit of a float64 gradient.
  for (const char* schedule : {"1f1b", "pipedream"}) {
    torch::manual_seed(8);
    auto a = testing::make_mlp();
    auto b = testing::clone_of(a);
    const auto options = PipelineOptions().workers(2).microbatches(4).schedule(schedule).optimizer(sgd(0.1, 0.9));
    StageRunner plain(a, options);
    StageRunner scaled(b, PipelineOptions(options).loss_scaling(LossScaling().init_scale(4096).growth_interval(1)));
    for (int step = 0; step < 4; ++step) {
      const at::Tensor x = torch::randn({8, 8}, torch::kFloat64);
      const at::Tensor y = torch::randn({8, 3}, torch::kFloat64);
      plain.train_step(x, y, testing::mse);
      const StepResult r = scaled.train_step(x, y, testing::mse);
      EXPECT_EQ(r.loss_scale, 4096.0 * std::pow(2.0, step)) << schedule;
    }
    const auto expected = plain.named_parameters();
    const auto got = scaled.named_parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(torch::equal(got[i].second, expected[i].second)) << schedule << ": " << got[i].first;
    }
  }
}

TEST(LossScaling, AnAsynchronousScheduleSkipsTheOverflowingStagesUpdatesAndBacksOffAfterTheStep) {
  torch::manual_seed(9);
  auto factor = std::make_shared<double>(1.0);
  auto model = bomb_mlp(factor);
  StageRunner pipe(model, PipelineOptions()
                           .workers(2)
                           .microbatches(4)
                           .schedule("pipedream")
                           .loss_scaling(LossScaling().init_scale(256).growth_interval(100))
                           .optimizer(sgd(0.1, 0.9)));
  const auto values = [&](int k) {
    std::vector<at::Tensor> v;
    for (const auto& p : pipe.stage(k).live()) v.push_back(p.detach().clone());
    return v;
  };
  const at::Tensor x = torch::randn({8, 8}, torch::kFloat64);
  const at::Tensor y = torch::randn({8, 3}, torch::kFloat64);
  pipe.train_step(x, y, testing::mse);
  const auto stage0 = values(0), stage1 = values(1);
  *factor = kInf;  // every update of stage 0 overflows; stage 1's gradients stay finite
  const StepResult r = pipe.train_step(x, y, testing::mse);
  EXPECT_EQ(r.skipped_updates, 4);
  EXPECT_EQ(r.updates, std::vector<int>({4, 4})) << "a skipped update counts: the weight versions advance";
  EXPECT_EQ(r.loss_scale, 256.0);
  EXPECT_EQ(pipe.loss_scaler_state()->scale, 128.0);
  const auto after0 = values(0), after1 = values(1);
  for (size_t i = 0; i < after0.size(); ++i) EXPECT_TRUE(torch::equal(after0[i], stage0[i])) << "stage 0 stepped";
  bool moved = false;
  for (size_t i = 0; i < after1.size(); ++i) moved = moved || !torch::equal(after1[i], stage1[i]);
  EXPECT_TRUE(moved) << "stage 1's clean updates were skipped";
  *factor = 1.0;
  const StepResult next = pipe.train_step(x, y, testing::mse);
  EXPECT_EQ(next.skipped_updates, 0);
  EXPECT_TRUE(std::isfinite(next.loss));
}

TEST(LossScaling, CheckpointsCarryTheScalersState) {
  examples::TempDir dir;
  const std::string path = (dir.path() / "scaler.ckpt").string();
  torch::manual_seed(10);
  auto factor = std::make_shared<double>(kInf);
  const auto options = PipelineOptions().workers(2).microbatches(2).optimizer(sgd(0.1)).loss_scaling(
      LossScaling().init_scale(512).growth_interval(3));
  StageRunner pipe(bomb_mlp(factor), options);
  const at::Tensor x = torch::randn({4, 8}, torch::kFloat64), y = torch::randn({4, 3}, torch::kFloat64);
  pipe.train_step(x, y, testing::mse);  // overflow: 256
  *factor = 1.0;
  pipe.train_step(x, y, testing::mse);  // clean: tracker 1
  save_checkpoint(path, pipe, {1, {}});
  StageRunner fresh(bomb_mlp(factor), options);
  EXPECT_EQ(fresh.loss_scaler_state()->scale, 512.0);
  load_checkpoint(path, fresh);
  EXPECT_EQ(fresh.loss_scaler_state()->scale, 256.0);
  EXPECT_EQ(fresh.loss_scaler_state()->growth_tracker, 1);
}

// ---------------------------------------------------------------------------
// Gradient accumulation.

TEST(Accumulation, NStepsEqualOneStepOnTheConcatenatedBatch) {
  for (const char* schedule : {"gpipe", "1f1b", "interleaved", "v-min", "dualpipev"}) {
    for (int n : {2, 3}) {
      const std::string where = c10::str(schedule, " n=", n);
      torch::manual_seed(11 + n);
      auto model = deep_mlp();
      auto reference = testing::clone_of(model);
      StageRunner pipe(model, PipelineOptions()
                               .workers(2)
                               .microbatches(4)
                               .schedule(schedule)
                               .accumulate_steps(n)
                               .clip_grad_norm(0.05)
                               .optimizer(sgd(0.2, 0.9)));
      torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.2).momentum(0.9));
      for (int update = 0; update < 2; ++update) {
        std::vector<at::Tensor> xs, ys;
        for (int i = 0; i < n; ++i) {
          xs.push_back(torch::randn({8, 8}, torch::kFloat64));
          ys.push_back(torch::randn({8, 3}, torch::kFloat64));
          const StepResult r = pipe.train_step(xs.back(), ys.back(), testing::mse);
          EXPECT_EQ(r.stepped, i == n - 1) << where;
        }
        ref_opt.zero_grad();
        testing::mse(reference->forward(torch::cat(xs)), torch::cat(ys)).backward();
        torch::nn::utils::clip_grad_norm_(reference->parameters(), 0.05);
        ref_opt.step();
        expect_same_values(pipe, reference, 1e-10, where + " update " + std::to_string(update));
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Options that cannot work.

TEST(TrainingOptionErrors, EachNamesTheOptionAndWhy) {
  // Through the class a user builds: the rows' bounds are checked there, once.
  const auto build = [](PipelineOptions options) { Pipeline(testing::make_mlp(), options.workers(2)); };
  EXPECT_THAT(error_of([&] { build(PipelineOptions().autocast(at::kDouble)); }),
              HasSubstr("Double is not a mixed-precision dtype"));
  EXPECT_THAT(error_of([&] { build(PipelineOptions().optimizer(sgd(0.1)).clip_grad_norm(-1)); }),
              HasSubstr("clip_grad_norm must be at least 0 and finite, got -1"));
  EXPECT_THAT(error_of([&] { build(PipelineOptions().optimizer(sgd(0.1)).clip_grad_norm(kInf)); }),
              HasSubstr("clip_grad_norm must be at least 0 and finite, got inf"));
  EXPECT_THAT(error_of([&] { build(PipelineOptions().optimizer(sgd(0.1)).clip_grad_norm(1).clip_norm_type(0)); }),
              HasSubstr("clip_norm_type must be positive"));
  EXPECT_THAT(error_of([&] { build(PipelineOptions().clip_grad_value(1)); }),
              HasSubstr("clip_grad_value clips before the pipeline's own optimizer steps"));
  EXPECT_THAT(error_of([&] { build(PipelineOptions().optimizer(sgd(0.1)).clip_grad_value(-1)); }),
              HasSubstr("clip_grad_value must be at least 0, got -1"));
  EXPECT_THAT(error_of([&] { build(PipelineOptions().clip_grad_norm(1)); }),
              HasSubstr("call Pipeline::clip_grad_norm(max_norm) between train_step and your optimizer's step"));
  EXPECT_THAT(error_of([&] { build(PipelineOptions().loss_scaling(LossScaling())); }),
              HasSubstr("loss scaling needs the pipeline's own optimizer"));
  EXPECT_THAT(error_of([&] { build(PipelineOptions().optimizer(sgd(0.1)).loss_scaling(LossScaling().backoff_factor(2))); }),
              HasSubstr("backoff_factor must be in (0, 1), got 2"));
  EXPECT_THAT(error_of([&] { build(PipelineOptions().optimizer(sgd(0.1)).loss_scaling(LossScaling().growth_factor(1))); }),
              HasSubstr("growth_factor must be more than 1, got 1"));
  EXPECT_THAT(error_of([&] { build(PipelineOptions().optimizer(sgd(0.1)).loss_scaling(LossScaling().init_scale(kInf))); }),
              HasSubstr("init_scale must be positive and finite, got inf"));
  EXPECT_THAT(error_of([&] { build(PipelineOptions().schedule("pipedream").microbatches(2).optimizer(sgd(0.1)).accumulate_steps(2)); }),
              HasSubstr("cannot accumulate over train_steps"));
  EXPECT_THAT(error_of([&] { build(PipelineOptions().accumulate_steps(2)); }),
              HasSubstr("accumulate_steps accumulates for the pipeline's own optimizer"));
  EXPECT_THAT(error_of([&] { build(PipelineOptions().optimizer(sgd(0.1)).accumulate_steps(0)); }),
              HasSubstr("accumulate_steps must be at least 1"));
  StageRunner pipe(testing::make_mlp(), PipelineOptions().workers(2));
  EXPECT_THAT(error_of([&] { pipe.clip_grad_norm(0); }), HasSubstr("positive finite max_norm"));
  EXPECT_THAT(error_of([&] { pipe.restore_loss_scaler(LossScalerState{}); }), HasSubstr("has no loss scaler"));
}

TEST(TrainingOptionErrors, WithoutAScalerTheDivergenceGuardStillCatchesANonFiniteLoss) {
  StageRunner pipe(testing::make_mlp(), PipelineOptions().workers(2).optimizer(sgd(0.1)));
  at::Tensor x = torch::randn({4, 8}, torch::kFloat64);
  x[0][0] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(error_of([&] { pipe.train_step(x, torch::randn({4, 3}, torch::kFloat64), testing::mse); }),
              HasSubstr("non-finite loss"));
}

}  // namespace
}  // namespace conveyor
