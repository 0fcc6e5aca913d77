// Partition policies and their errors: pure decisions, no training.
#include "error_of.h"
#include "test_models.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;

using testing::error_of;

TEST(Partition, UniformGivesTheRemainderToEarlyStages) {
  EXPECT_EQ(uniform_boundaries(7, 3), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(uniform_boundaries(8, 4), (std::vector<int64_t>{2, 4, 6}));
  EXPECT_EQ(uniform_boundaries(5, 1), (std::vector<int64_t>{}));
}

TEST(Partition, BalancedMinimisesTheLargestStage) {
  // Best 2-way split of {1,1,1,6,1}: [1,1,1] | [6,1] -> max 7; any other cut is worse.
  EXPECT_EQ(balanced_boundaries({1, 1, 1, 6, 1}, 2), (std::vector<int64_t>{3}));
  // A dominant layer gets a stage to itself.
  EXPECT_EQ(balanced_boundaries({1, 100, 1, 1}, 3), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(balanced_boundaries({2, 2, 2, 2}, 4), (std::vector<int64_t>{1, 2, 3}));
}

TEST(Partition, BalanceByParametersIsolatesTheLargeLayer) {
  torch::nn::Sequential m(torch::nn::Linear(4, 4), torch::nn::ReLU(), torch::nn::Linear(4, 512),
                          torch::nn::Linear(512, 4));
  const StageSplit plan = split_stages(m, PipelineOptions().workers(2).balance(Balance::kParameters));
  ASSERT_EQ(plan.stages.size(), 2u);
  // Layer 2 has 2,560 parameters, layer 3 has 2,052: each goes to its own stage.
  EXPECT_EQ(plan.stages[0].end, 3);
  EXPECT_EQ(plan.str(), "stage 0: layers [0, 3) on cpu; stage 1: layers [3, 4) on cpu");
}

TEST(Partition, ExplicitBoundariesDefineTheStages) {
  const StageSplit plan = split_stages(testing::make_mlp(), PipelineOptions().boundaries({2, 5}));
  ASSERT_EQ(plan.stages.size(), 3u);
  EXPECT_EQ(plan.stages[1].begin, 2);
  EXPECT_EQ(plan.stages[1].end, 5);
  EXPECT_EQ(plan.stages[2].end, 7);
}

TEST(Partition, RejectsBadBoundaries) {
  const auto mlp = testing::make_mlp();
  EXPECT_THAT(error_of([&] {
                split_stages(mlp, PipelineOptions().boundaries({4, 2}));
              }),
              HasSubstr("strictly increasing, but boundary 1 (2) follows 4"));
  EXPECT_THAT(error_of([&] {
                split_stages(mlp, PipelineOptions().boundaries({3, 7}));
              }),
              HasSubstr("boundary 1 is 7, out of range"));
  EXPECT_THAT(error_of([&] { split_stages(mlp, PipelineOptions().boundaries({0})); }),
              HasSubstr("boundary 0 is 0, out of range"));
  EXPECT_THAT(error_of([&] { split_stages(mlp, PipelineOptions().workers(4).boundaries({3})); }),
              HasSubstr("1 boundaries define 2 stages, but workers(4) was asked for"));
}

TEST(Partition, RejectsMoreStagesThanLayersAndEmptyModels) {
  EXPECT_THAT(error_of([&] { split_stages(testing::make_mlp(), PipelineOptions().workers(8)); }),
              HasSubstr("8 stages asked for a model of only 7 layers"));
  EXPECT_THAT(error_of([&] { split_stages(torch::nn::Sequential(), PipelineOptions().workers(1)); }),
              HasSubstr("the model is empty"));
}

TEST(Partition, DevicesAreCheckedPerWorker) {
  EXPECT_THAT(error_of([] { worker_devices({"cpu", "tpu:0"}, 2); }), HasSubstr("unknown device 'tpu:0' for worker 1"));
  EXPECT_THAT(error_of([] { worker_devices({"cpu", "cpu", "cpu"}, 2); }), HasSubstr("3 devices given for 2 workers"));
  const int64_t visible = static_cast<int64_t>(torch::cuda::device_count());
  const std::string beyond = "cuda:" + std::to_string(visible);
  const std::string expected =
      visible == 0 ? "no CUDA device is available" : "only " + std::to_string(visible) + " CUDA device(s) are visible";
  EXPECT_THAT(error_of([&] { worker_devices({"cpu", beyond}, 2); }), HasSubstr(expected));
  const auto devices = worker_devices({"cpu"}, 3);
  EXPECT_EQ(devices.size(), 3u);
  EXPECT_TRUE(devices[2].is_cpu());
}

}  // namespace
}  // namespace conveyor
