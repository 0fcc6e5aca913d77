// The builder (plugin/pipeline.h): one path from a model to a
// pipeline. torch::nn layers cut where split points name them train as the
// unsplit model does; the plan phase profiles once and searches, and says what
// each plan mode lacks; what a request gives twice or not at all is refused.
#include "error_of.h"
#include "test_models.h"

#include "plugin/pipeline.h"

namespace conveyor {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

SampleBatch sample_batch(int64_t n = 8) {
  return {{torch::randn({n, 8}, torch::kFloat64)}, {torch::randn({n, 3}, torch::kFloat64)}};
}

TEST(Builder, TorchNnLayersAreCutWhereTheSplitPointsNameThem) {
  for (const char* schedule : testing::kSyncSchedules) {
    torch::manual_seed(1);
    auto model = testing::make_mlp();
    auto reference = testing::clone_of(model);
    const std::string where = schedule;
    Pipeline built(model, {.options = PipelineOptions().microbatches(3).schedule(schedule).split_points({"2", "6"}),
                                .loss = testing::mse_of_first});
    const StageRunner& pipe = built.runner();
    ASSERT_EQ(pipe.num_stages(), 3) << where;
    EXPECT_EQ(pipe.split().stages.at(1).begin, 2) << where;
    EXPECT_EQ(pipe.split().stages.at(2).begin, 6) << where;
    const SampleBatch b = sample_batch(9);
    const double loss = built.train_step(b.inputs, b.targets).loss;
    const at::Tensor ref_loss = torch::mse_loss(reference->forward(b.inputs[0]), b.targets[0]);
    ref_loss.backward();
    EXPECT_NEAR(loss, ref_loss.item<double>(), 1e-12) << where;
    testing::expect_same_grads(pipe, reference, 1e-12, 1e-10, where);
  }
}

TEST(Builder, SplitPointsOfTorchNnLayersAreChecked) {
  const auto cut = [](std::vector<std::string> split, PipelineOptions options = PipelineOptions()) {
    return testing::invalid_argument_of([&] {
      Pipeline(testing::make_mlp(), {.options = options.split_points(split)});
    });
  };
  EXPECT_EQ(cut({"head"}), "conveyor: split point 'head' names no layer of the model (0, 1, 2, 3, 4, 5, 6)");
  EXPECT_THAT(cut({"0"}), HasSubstr("split point '0' must come after the one before it, and not be the first layer"));
  EXPECT_THAT(cut({"4", "2"}), HasSubstr("split point '2' must come after the one before it"));
  EXPECT_THAT(cut({"2", "4"}, PipelineOptions().workers(2)),
              HasSubstr("2 split points make 3 stages, but the options ask for 2"));
  EXPECT_THAT(cut({"2"}, PipelineOptions().boundaries({3})), HasSubstr("give either split points or boundaries"));
  EXPECT_THAT(testing::invalid_argument_of([] {
                Pipeline(testing::make_mlp(), {.options = PipelineOptions().optimize(true)});
              }),
              HasSubstr("optimize lets the TorchScript executor optimize the stages; the model is torch::nn layers"));
}

TEST(Builder, BalanceByTimeProfilesTheSampleAndPredictsTheStep) {
  const SampleBatch b = sample_batch();
  Pipeline built(testing::make_mlp(),
                      {.options = PipelineOptions().workers(2).microbatches(2).balance(Balance::kTime),
                       .loss = testing::mse_of_first,
                       .sample = b});
  ASSERT_TRUE(built.prediction().has_value());
  EXPECT_EQ(built.prediction()->balance, "time");
  ASSERT_NE(built.runner().options().profile(), nullptr);
  EXPECT_EQ(built.runner().options().profile()->batch_size, 4) << "the first of 2 micro-batches of 8";
  EXPECT_THAT(built.plan_text(), HasSubstr("predicted step"));
  EXPECT_THAT(testing::invalid_argument_of([] {
                Pipeline(testing::make_mlp(), {.options = PipelineOptions().balance(Balance::kTime)});
              }),
              HasSubstr("balance by time profiles the model on a sample batch: give one"));
}

TEST(Builder, PlanAutoSearchesTheWholePlanOnTheSample) {
  Pipeline built(testing::make_mlp(), {.options = PipelineOptions().plan(PlanMode::kAuto).max_workers(2),
                                            .loss = testing::mse_of_first,
                                            .sample = sample_batch()});
  EXPECT_THAT(built.plan_text(), AllOf(HasSubstr("searched"), HasSubstr("the fastest")));
  ASSERT_TRUE(built.prediction().has_value());
  EXPECT_EQ(built.prediction()->balance, "searched");
  EXPECT_LE(built.runner().num_workers(), 2);
  const SampleBatch b = sample_batch();
  EXPECT_TRUE(std::isfinite(built.train_step(b.inputs, b.targets).loss));
}

TEST(Builder, EachPlanModeSaysWhatItLacks) {
  const auto build = [](BuildRequest request) {
    return testing::invalid_argument_of([&] { Pipeline(testing::make_mlp(), std::move(request)); });
  };
  EXPECT_THAT(build({.options = PipelineOptions().plan(PlanMode::kAuto)}),
              HasSubstr("plan \"auto\" profiles the model: give sample=(inputs, target)"));
  EXPECT_THAT(build({.options = PipelineOptions().plan(PlanMode::kTuned).split_points({"2"}), .sample = sample_batch()}),
              HasSubstr("plan \"tuned\" chooses where to cut: give no split_points"));
  EXPECT_THAT(build({.options = PipelineOptions().schedule("pipedream").plan(PlanMode::kAuto),
                     .sample = sample_batch()}),
              HasSubstr("plan \"auto\" searches the synchronous schedules: leave out schedule \"pipedream\""));
  EXPECT_THAT(build({.options = PipelineOptions().max_workers(2)}),
              HasSubstr("max_workers and memory_budget bound the search of plan=\"auto\""));
}

TEST(Builder, WhatARequestGivesTwiceOrNotAtAllIsRefused) {
  const auto sgd = [](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, 0.1); };
  EXPECT_THAT(testing::invalid_argument_of([&] {
                Pipeline(testing::make_mlp(), PipelineOptions().optimizer(sgd).lr(0.1));
              }),
              HasSubstr("option 'lr' is for an optimizer given by name; the factory given as 'optimizer' makes"));
  EXPECT_THAT(testing::invalid_argument_of([&] {
                Pipeline(testing::make_mlp(), PipelineOptions().optimizer(OptimizerName::kAdam));
              }),
              HasSubstr("option 'optimizer' needs 'lr'"));
  Pipeline no_loss(testing::make_mlp(), BuildRequest{});
  const SampleBatch b = sample_batch();
  EXPECT_EQ(testing::invalid_argument_of([&] { no_loss.train_step(b.inputs, b.targets); }),
            "conveyor: train_step needs a loss: pass one, or give BuildRequest::loss");
  EXPECT_THAT(testing::invalid_argument_of([] { Pipeline(std::string("/nonexistent/model.pt")); }),
              HasSubstr("/nonexistent/model.pt"));
}

TEST(Builder, ARequestIsCheckedOnceAndACheckedOneNotAgain) {
  const auto since = [](const RequestCounts& before) {
    const RequestCounts now = request_counts();
    return std::vector<int64_t>{now.checks - before.checks, now.plan_checks - before.plan_checks,
                                now.kind_checks - before.kind_checks};
  };
  const BuildRequest request{.options = PipelineOptions().microbatches(2), .loss = testing::mse_of_first};
  RequestCounts before = request_counts();
  Pipeline(testing::make_mlp(), request);
  EXPECT_EQ(since(before), (std::vector<int64_t>{1, 1, 1})) << "the request, its plan and the model's kind";
  CheckedRequest checked(request, 0, ModelKind::layers);
  before = request_counts();
  Pipeline(testing::make_mlp(), checked);
  EXPECT_EQ(since(before), (std::vector<int64_t>{0, 0, 0})) << "checked before: not again";
  // Checked for a file's model, whose kind is known once it is read: the build checks the kind, once.
  CheckedRequest for_a_file(request, 0, std::nullopt);
  before = request_counts();
  Pipeline(testing::make_mlp(), for_a_file);
  EXPECT_EQ(since(before), (std::vector<int64_t>{0, 0, 1}));
  // What the check promised holds: a loss where it saw one, the processes it was checked for.
  CheckedRequest without_loss(BuildRequest{}, 0, ModelKind::layers);
  EXPECT_THAT(testing::invalid_argument_of([&] { without_loss.attach_loss(testing::mse_of_first); }),
              HasSubstr("the request was checked without a loss"));
}

TEST(Builder, EveryShardLevelIsAcceptedAcrossProcesses) {
  for (const ShardLevel level : {ShardLevel::kOptimizer, ShardLevel::kGradients, ShardLevel::kParameters}) {
    EXPECT_NO_THROW(CheckedRequest(BuildRequest{.options = PipelineOptions().shard(level)}, 2, ModelKind::layers));
  }
  // In one process, no level but none: there are no replicas.
  EXPECT_THAT(testing::invalid_argument_of([] {
                Pipeline(testing::make_mlp(), PipelineOptions().shard(ShardLevel::kOptimizer));
              }),
              HasSubstr("option 'shard' is for a pipeline across processes"));
}

}  // namespace
}  // namespace conveyor
