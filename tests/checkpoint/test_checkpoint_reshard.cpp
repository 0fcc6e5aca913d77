// Checkpoints that move between layouts: a run saved at K stages resumes at
// K' as if it had never stopped (each stage's own optimizer regrouped by
// parameter name), what cannot be regrouped is refused before anything
// changes, and the weights reach a plain model through a state dict.
#include "error_of.h"
#include "plugin/checkpoint/checkpoint.h"
#include "plugin/checkpoint/model_state.h"

#include "test_models.h"

#include <filesystem>
#include <unistd.h>

namespace conveyor {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string reshard_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("conveyor_reshard_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// The pipeline's own Adam, one per stage, stepped by train_step.
PipelineOptions with_adam(int stages) {
  return PipelineOptions().workers(stages).microbatches(4).schedule("1f1b").optimizer([](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-2));
  });
}

// Each step's batch from the global generator, which a checkpoint restores.
void steps(StageRunner& pipe, int n) {
  for (int i = 0; i < n; ++i) {
    const at::Tensor x = torch::randn({12, 8}, torch::kFloat64), y = torch::randn({12, 3}, torch::kFloat64);
    pipe.train_step(x, y, testing::mse);
  }
}

// 3 steps at K = 2, saved; resumed at K = 3 and K = 1 from other initial
// weights, 3 more steps: the weights of 6 uninterrupted steps at K = 2 (Adam's
// moments restored, or the steps after would differ), every new stage 3
// updates in, and the resumed run's own checkpoint holds the same state.
TEST(ReshardCheckpoint, ResumesAtAnotherStageCountAsIfItNeverStopped) {
  torch::manual_seed(0);
  const auto initial = testing::make_mlp();
  torch::manual_seed(1);
  StageRunner uninterrupted(testing::clone_of(initial), with_adam(2));
  steps(uninterrupted, 3);
  const std::string path = reshard_path("k2.ckpt");
  save_checkpoint(path, uninterrupted, {3, {}});
  steps(uninterrupted, 3);
  for (int k : {3, 1}) {
    SCOPED_TRACE("K = " + std::to_string(k));
    torch::manual_seed(7);  // other weights, another generator state: the file restores both
    StageRunner resumed(testing::make_mlp(), with_adam(k));
    ASSERT_EQ(load_checkpoint(path, resumed), 3);
    for (int s = 0; s < k; ++s) EXPECT_EQ(resumed.stage(s).updates(), 3) << s;
    steps(resumed, 3);
    const auto want = uninterrupted.named_parameters(), got = resumed.named_parameters();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].first, want[i].first);
      EXPECT_LE((got[i].second - want[i].second).abs().max().item<double>(), 1e-12) << want[i].first;
    }
  }
  std::filesystem::remove(path);
}

TEST(ReshardCheckpoint, RefusesWhatIsPerStageAndChangesNothing) {
  torch::manual_seed(0);
  const std::string path = reshard_path("refused.ckpt");
  StageRunner saved(testing::make_mlp(), with_adam(2));
  steps(saved, 1);
  save_checkpoint(path, saved, {1, {}});

  StageRunner plain(testing::make_mlp(), PipelineOptions().workers(3));  // no optimizer of its own
  const at::Tensor before = plain.parameters()[0].clone();
  EXPECT_THAT(testing::error_of([&] { load_checkpoint(path, plain); }),
              HasSubstr("holds state of its stages' own optimizers, but this pipeline has no such optimizers"));
  StageRunner random(testing::make_mlp(), with_adam(3).stage_rng(true));
  EXPECT_THAT(testing::error_of([&] { load_checkpoint(path, random); }),
              AllOf(HasSubstr("is of a pipeline of 2 stages, this one has 3"), HasSubstr("stage_rng")));
  EXPECT_TRUE(torch::equal(plain.parameters()[0], before));

  // A model whose names or shapes differ: the first mismatch named.
  torch::nn::Sequential wider(torch::nn::Linear(8, 32), torch::nn::Tanh(), torch::nn::Linear(32, 16), torch::nn::ReLU(),
                              torch::nn::Linear(16, 8), torch::nn::Tanh(), torch::nn::Linear(8, 3));
  wider->to(torch::kFloat64);
  StageRunner other(wider, with_adam(3));
  EXPECT_THAT(testing::error_of([&] { load_checkpoint(path, other); }),
              HasSubstr("'0.weight' has shape [16, 8] there and [32, 8] here"));
  std::filesystem::remove(path);
}

// The weights by the model's own names: from a pipeline or a checkpoint of
// any stage count into the unsplit model, which then gives the same loss.
TEST(ModelState, APlainStateDictLoadsIntoTheUnsplitModel) {
  torch::manual_seed(0);
  StageRunner pipe(testing::make_mlp(), with_adam(3));
  steps(pipe, 2);
  const std::string dict = reshard_path("model.pt"), ckpt = reshard_path("model.ckpt");
  save_model_state(dict, pipe);
  save_checkpoint(ckpt, pipe, {2, {}});
  const at::Tensor x = torch::randn({12, 8}, torch::kFloat64), y = torch::randn({12, 3}, torch::kFloat64);
  const double want = testing::mse(pipe.forward(x), y).item<double>();
  for (const std::string& path : {dict, ckpt}) {
    torch::manual_seed(5);
    auto plain = testing::make_mlp();
    load_model_state(path, *plain);
    // (the pipeline's forward runs micro-batches: equal to rounding)
    EXPECT_NEAR(testing::mse(plain->forward(x), y).item<double>(), want, 1e-12) << path;
  }
  // And back out of a module, into another.
  auto plain = testing::make_mlp();
  load_model_state(dict, *plain);
  const std::string again = reshard_path("again.pt");
  save_model_state(again, *plain);
  auto copy = testing::make_mlp(torch::kFloat64);
  load_model_state(again, *copy);
  EXPECT_TRUE(torch::equal(copy->parameters()[0], plain->parameters()[0]));

  torch::nn::Sequential shorter(torch::nn::Linear(8, 16), torch::nn::Tanh());
  shorter->to(torch::kFloat64);
  EXPECT_THAT(testing::error_of([&] { load_model_state(dict, *shorter); }),
              HasSubstr("this one has no '"));
  EXPECT_THAT(testing::error_of([&] { load_model_state(reshard_path("missing.pt"), *plain); }),
              HasSubstr("no such file"));
  for (const auto& p : {dict, ckpt, again}) std::filesystem::remove(p);
}

}  // namespace
}  // namespace conveyor
