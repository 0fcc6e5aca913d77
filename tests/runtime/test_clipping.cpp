// Clipping before the pipeline's own optimizer steps, by global norm and by
// value, each against the unsplit model doing the same
// (torch::nn::utils::clip_grad_norm_, clip_grad_value_), and a caller's own
// optimizer clipping with Pipeline::clip_grad_norm.
#include "reference_trainer.h"
#include "runtime/training_models.h"
#include "test_models.h"

#include <cmath>

namespace conveyor {
namespace {

using testing::deep_mlp;
using testing::expect_same_values;
using testing::kInf;
using testing::kSynchronous;
using testing::sgd;

// ---------------------------------------------------------------------------
// Clipping by global norm.

TEST(Clipping, EqualsClipGradNormOfTheUnsplitModelOnEverySynchronousSchedule) {
  for (const char* schedule : kSynchronous) {
    for (int k = 2; k <= 4; ++k) {
      for (double norm_type : {2.0, kInf}) {
        const std::string where = c10::str(schedule, " K=", k, " norm ", norm_type);
        torch::manual_seed(k);
        auto model = deep_mlp();
        auto reference = testing::clone_of(model);
        StageRunner pipe(model, PipelineOptions()
                                 .workers(k)
                                 .microbatches(2 * k)
                                 .schedule(schedule)
                                 .clip_grad_norm(0.02)
                                 .clip_norm_type(norm_type)
                                 .optimizer(sgd(1.0)));
        torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(1.0));
        for (int step = 0; step < 2; ++step) {
          const at::Tensor x = torch::randn({4 * k, 8}, torch::kFloat64);
          const at::Tensor y = torch::randn({4 * k, 3}, torch::kFloat64);
          const StepResult r = pipe.train_step(x, y, testing::mse);
          ref_opt.zero_grad();
          testing::mse(reference->forward(x), y).backward();
          const double norm = torch::nn::utils::clip_grad_norm_(reference->parameters(), 0.02, norm_type);
          ref_opt.step();
          ASSERT_GT(norm, 0.02) << where << ": the test must clip";
          EXPECT_TRUE(r.stepped) << where;
          EXPECT_NEAR(r.grad_norm, norm, 1e-10) << where;
          expect_same_values(pipe, reference, 1e-10, where + " step " + std::to_string(step));
        }
      }
    }
  }
}

TEST(Clipping, ACallersOwnOptimizerClipsWithPipelineClipGradNorm) {
  for (int k = 2; k <= 4; ++k) {
    torch::manual_seed(20 + k);
    auto model = deep_mlp();
    auto reference = testing::clone_of(model);
    StageRunner pipe(model, PipelineOptions().workers(k).microbatches(k).schedule("1f1b"));
    const at::Tensor x = torch::randn({2 * k, 8}, torch::kFloat64);
    const at::Tensor y = torch::randn({2 * k, 3}, torch::kFloat64);
    const StepResult r = pipe.train_step(x, y, testing::mse);
    EXPECT_FALSE(r.stepped);
    EXPECT_TRUE(std::isnan(r.grad_norm));
    testing::mse(reference->forward(x), y).backward();
    const double norm = torch::nn::utils::clip_grad_norm_(reference->parameters(), 0.01);
    EXPECT_NEAR(pipe.clip_grad_norm(0.01), norm, 1e-10) << "K=" << k;
    testing::expect_same_grads(pipe, reference, 1e-10, 0, "K=" + std::to_string(k));
  }
}

TEST(Clipping, AsynchronousSchedulesClipEachUpdateByItsStagesNormBitForBit) {
  struct Case {
    const char* schedule;
    bool vertical_sync;
    testing::Method method;
  };
  for (const Case& c : {Case{"pipedream", false, testing::Method::kStashed},
                        Case{"pipedream", true, testing::Method::kStashedVerticalSync},
                        Case{"ddg", false, testing::Method::kStashed},
                        Case{"fr", false, testing::Method::kFeaturesReplay}}) {
    for (int k : {2, 3}) {
      const std::string where = c10::str(c.schedule, c.vertical_sync ? "+vertical-sync" : "", " K=", k);
      torch::manual_seed(40 + k);
      auto model = testing::make_mlp();
      auto reference_model = testing::clone_of(model);
      const int m = k + 2;
      StageRunner pipe(model, PipelineOptions()
                               .workers(k)
                               .microbatches(m)
                               .schedule(c.schedule)
                               .vertical_sync(c.vertical_sync)
                               .clip_grad_norm(0.05)
                               .optimizer(sgd(0.5, 0.9)));
      testing::ReferenceTrainer reference(testing::split_like_pipeline(reference_model, k), c.method, sgd(0.5, 0.9),
                                          nullptr, /*max_norm=*/0.05);
      for (int step = 0; step < 4; ++step) {
        const at::Tensor x = torch::randn({3 * m, 8}, torch::kFloat64);
        const at::Tensor y = torch::tanh(x.narrow(1, 0, 3));
        const StepResult r = pipe.train_step(x, y, testing::mse);
        reference.step(x.tensor_split(m), y.tensor_split(m), testing::mse);
        EXPECT_GT(r.grad_norm, 0.05) << where << ": the test must clip";
        const auto ref = reference_model->named_parameters();
        for (const auto& [name, p] : pipe.named_parameters()) {
          ASSERT_TRUE(torch::equal(p, *ref.find(name))) << where << " step " << step << ": " << name;
        }
      }
    }
  }
}

// Clipping by value: every gradient element within [-v, v] before the
// pipeline's optimizer steps, then (when also given) by norm, as
// clip_grad_value_ and clip_grad_norm_ in that order on the unsplit model.
TEST(Clipping, ByValueEqualsClipGradValueOfTheUnsplitModel) {
  for (const char* schedule : {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipev"}) {
    for (double max_norm : {0.0, 0.02}) {
      const std::string where = c10::str(schedule, " clip_grad_norm ", max_norm);
      torch::manual_seed(7);
      auto model = deep_mlp();
      auto reference = testing::clone_of(model);
      StageRunner pipe(model, PipelineOptions()
                               .workers(2)
                               .microbatches(4)
                               .schedule(schedule)
                               .clip_grad_value(0.002)
                               .clip_grad_norm(max_norm)
                               .optimizer(sgd(1.0)));
      torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(1.0));
      for (int step = 0; step < 2; ++step) {
        const at::Tensor x = torch::randn({8, 8}, torch::kFloat64);
        const at::Tensor y = torch::randn({8, 3}, torch::kFloat64);
        pipe.train_step(x, y, testing::mse);
        ref_opt.zero_grad();
        testing::mse(reference->forward(x), y).backward();
        double largest = 0;
        for (const auto& p : reference->parameters()) largest = std::max(largest, p.grad().abs().max().item<double>());
        ASSERT_GT(largest, 0.002) << where << ": the test must clip";
        torch::nn::utils::clip_grad_value_(reference->parameters(), 0.002);
        if (max_norm > 0) torch::nn::utils::clip_grad_norm_(reference->parameters(), max_norm);
        ref_opt.step();
        expect_same_values(pipe, reference, 1e-10, where + " step " + std::to_string(step));
      }
    }
  }
}

TEST(Clipping, ByValueClipsEachAsynchronousUpdateBitForBit) {
  for (const auto& [schedule, method] :
       {std::pair{"pipedream", testing::Method::kStashed}, std::pair{"fr", testing::Method::kFeaturesReplay}}) {
    torch::manual_seed(41);
    auto model = testing::make_mlp();
    auto reference_model = testing::clone_of(model);
    const auto options = PipelineOptions().workers(2).microbatches(4).schedule(schedule).optimizer(sgd(0.5, 0.9));
    StageRunner pipe(model, PipelineOptions(options).clip_grad_value(0.01));
    StageRunner unclipped(testing::clone_of(model), options);
    testing::ReferenceTrainer reference(testing::split_like_pipeline(reference_model, 2), method, sgd(0.5, 0.9),
                                        nullptr, /*max_norm=*/0, /*max_value=*/0.01);
    for (int step = 0; step < 3; ++step) {
      const at::Tensor x = torch::randn({12, 8}, torch::kFloat64);
      const at::Tensor y = torch::tanh(x.narrow(1, 0, 3));
      pipe.train_step(x, y, testing::mse);
      unclipped.train_step(x, y, testing::mse);
      reference.step(x.tensor_split(4), y.tensor_split(4), testing::mse);
      const auto ref = reference_model->named_parameters();
      for (const auto& [name, p] : pipe.named_parameters()) {
        ASSERT_TRUE(torch::equal(p, *ref.find(name))) << schedule << " step " << step << ": " << name;
      }
    }
    EXPECT_FALSE(torch::equal(pipe.parameters()[0], unclipped.parameters()[0])) << schedule << ": the test must clip";
  }
}

}  // namespace
}  // namespace conveyor
