// profile_first_microbatch: the one place a model is profiled on the first
// micro-batch of a whole batch, split as the pipeline will split it.
#include "error_of.h"
#include "test_models.h"

#include "plugin/measure/profile_model.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;

ProfileOptions no_repeats() { return ProfileOptions().warmup(0).repeats(1).action_overhead(false); }

TEST(ProfileFirstMicrobatch, ProfilesTheFirstOfTheMicrobatchesThePipelineMakes) {
  auto mlp = testing::make_mlp();
  // 10 samples in 3 micro-batches: 4, 3, 3 (tensor_split).
  const at::Tensor x = torch::randn({10, 8}, torch::kFloat64), y = torch::randn({10, 3}, torch::kFloat64);
  const ModelProfile p = profile_first_microbatch(mlp, x, y, testing::mse, PipelineOptions().microbatches(3), no_repeats());
  EXPECT_EQ(p.batch_size, 4);
  EXPECT_EQ(p.input_bytes, 4 * 8 * 8);
  EXPECT_EQ(p.layers.at(0).update_seconds, 0) << "no optimizer, none priced";
}

TEST(ProfileFirstMicrobatch, PricesThePipelinesOptimizerAndRefusesABatchTooSmall) {
  auto mlp = testing::make_mlp();
  const at::Tensor x = torch::randn({9, 8}, torch::kFloat64), y = torch::randn({9, 3}, torch::kFloat64);
  const auto sgd = [](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, 0.1); };
  const ModelProfile p =
      profile_first_microbatch(mlp, x, y, testing::mse, PipelineOptions().microbatches(3).optimizer(sgd), no_repeats());
  EXPECT_EQ(p.batch_size, 3);
  EXPECT_GT(p.layers.at(0).update_seconds, 0) << "the options' optimizer is priced";
  EXPECT_THAT(testing::invalid_argument_of([&] {
                profile_first_microbatch(mlp, x, y, testing::mse, PipelineOptions().microbatches(10), no_repeats());
              }),
              HasSubstr("a batch of 9 samples cannot be split into 10 micro-batches"));
}

}  // namespace
}  // namespace conveyor
