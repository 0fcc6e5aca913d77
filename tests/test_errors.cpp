// Bad input gets a clear error naming its cause, and the pipeline survives it:
// no crash, no hang, and the next good step is exact.
#include "error_of.h"
#include "plugin/pipeline.h"
#include "plugin/transport/mailbox.h"
#include "test_models.h"

#include <chrono>
#include <thread>

namespace conveyor {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

using testing::error_of;

// Throws on its n-th call (0-based), passes its input through otherwise.
struct ThrowOnCallImpl : torch::nn::Cloneable<ThrowOnCallImpl> {
  explicit ThrowOnCallImpl(int n) : n(n) {}
  void reset() override {}
  at::Tensor forward(const at::Tensor& x) {
    if (calls++ == n) throw std::runtime_error("injected failure");
    return x;
  }
  int n;
  int calls = 0;  // one stage thread calls it
};
TORCH_MODULE(ThrowOnCall);

// Sleeps before passing its input through: a stage that stalls.
struct StallImpl : torch::nn::Cloneable<StallImpl> {
  explicit StallImpl(std::chrono::milliseconds d) : delay(d) {}
  void reset() override {}
  at::Tensor forward(const at::Tensor& x) {
    std::this_thread::sleep_for(delay);
    return x;
  }
  std::chrono::milliseconds delay;
};
TORCH_MODULE(Stall);

TEST(BadInput, ConfigurationErrorsAreClear) {
  const auto mlp = testing::make_mlp();
  EXPECT_THAT(error_of([&] { Pipeline(mlp, PipelineOptions().workers(9)); }),
              HasSubstr("9 stages asked for a model of only 7 layers"));
  EXPECT_THAT(error_of([&] { Pipeline(torch::nn::Sequential(), PipelineOptions()); }),
              HasSubstr("the model is empty"));
  EXPECT_THAT(error_of([&] {
                Pipeline(mlp, PipelineOptions().boundaries({5, 3}));
              }),
              HasSubstr("strictly increasing, but boundary 1 (3) follows 5"));
  EXPECT_THAT(error_of([&] {
                Pipeline(mlp, PipelineOptions().boundaries({2, 9}));
              }),
              HasSubstr("boundary 1 is 9, out of range"));
  EXPECT_THAT(error_of([&] {
                Pipeline(mlp, PipelineOptions().workers(2).devices({"cpu", "gpu:1"}));
              }),
              HasSubstr("unknown device 'gpu:1' for worker 1"));
  EXPECT_THAT(error_of([&] { Pipeline(mlp, PipelineOptions().workers(2).schedule("zigzag")); }),
              HasSubstr("unknown schedule 'zigzag' (known: sequential, gpipe, 1f1b, eager-1f1b, interleaved, zb-h1, "
                        "zb-interleaved, zb-v, v-half, v-min, dualpipev, pipedream, ddg, fr)"));
  EXPECT_THAT(error_of([&] { Pipeline(mlp, PipelineOptions().workers(2).microbatches(0)); }),
              HasSubstr("microbatches must be at least 1, got 0"));
  EXPECT_THAT(error_of([&] { Pipeline(mlp, PipelineOptions().workers(2).microbatches(2).channel_capacity(0)); }),
              HasSubstr("deadlocks under blocking transfers with channel capacity 0"));
  EXPECT_THAT(error_of([&] {
                Pipeline(mlp,
                         PipelineOptions().workers(3).microbatches(2).schedule_text(schedules::make_gpipe(2, 2).str()));
              }),
              HasSubstr("the schedule is for 2 workers and 2 micro-batches, the pipeline has 3 workers and 2"));
  EXPECT_THAT(
      error_of([&] { Pipeline(mlp, PipelineOptions().workers(1).microbatches(2).schedule_text("0F0 0B0 0F1\n")); }),
      HasSubstr("never runs the backward of micro-batch 1 (no action 0B1)"));
}

TEST(BadInput, ARunnerBuiltDirectlyChecksTheOptionValuesItself) {
  const auto sgd = [](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, 0.1); };
  EXPECT_THAT(error_of([&] {
                StageRunner(testing::make_mlp(), PipelineOptions().workers(2).optimizer(sgd).accumulate_steps(0));
              }),
              HasSubstr("accumulate_steps must be at least 1, got 0"));
  EXPECT_THAT(error_of([&] { StageRunner(testing::make_mlp(), PipelineOptions().workers(2).microbatches(0)); }),
              HasSubstr("microbatches"));
}

TEST(BadInput, BatchesThatDoNotSplit) {
  StageRunner pipe(testing::make_mlp(), PipelineOptions().workers(2).microbatches(4));
  const auto x = torch::randn({3, 8}, torch::kFloat64);
  EXPECT_THAT(error_of([&] {
                pipe.train_step(x, torch::randn({3, 3}, torch::kFloat64), testing::mse);
              }),
              HasSubstr("a batch of 3 samples cannot be split into 4 micro-batches"));
  EXPECT_THAT(
      error_of([&] {
        pipe.train_step(torch::randn({8, 8}, torch::kFloat64), torch::randn({6, 3}, torch::kFloat64), testing::mse);
      }),
      HasSubstr("the input has 8 samples along dimension 0 but the target has 6"));
  EXPECT_THAT(error_of([&] {
                pipe.train_step(torch::randn({8, 8}, torch::kFloat64), at::Tensor(), testing::mse);
              }),
              HasSubstr("the target is undefined"));
}

TEST(BadInput, ShapeRejectedByAStageNamesTheStageAndLayer) {
  StageRunner pipe(testing::make_mlp(), PipelineOptions().workers(2).microbatches(2));
  // The first layer is Linear(8, 16): 5 features do not fit.
  try {
    pipe.train_step(torch::randn({4, 5}, torch::kFloat64), torch::randn({4, 3}, torch::kFloat64), testing::mse);
    FAIL() << "expected an error";
  } catch (const PipelineError& e) {
    EXPECT_EQ(e.stage(), 0);
    EXPECT_EQ(e.microbatch(), 0);
    EXPECT_EQ(e.action(), "0F0");
    EXPECT_THAT(e.what(), HasSubstr("stage 0 failed in 0F0 (forward of micro-batch 0): layer 0 (torch::nn::Linear"));
    EXPECT_THAT(e.what(), HasSubstr("cannot be multiplied"));
  }
  // A target the loss rejects fails on the last stage and says so.
  EXPECT_THAT(
      error_of([&] {
        pipe.train_step(torch::randn({4, 8}, torch::kFloat64), torch::randn({4, 7}, torch::kFloat64), testing::mse);
      }),
      HasSubstr("stage 1 failed in 1F0 (forward of micro-batch 0)"));
  // A loss that is not a scalar.
  EXPECT_THAT(error_of([&] {
                pipe.train_step(torch::randn({4, 8}, torch::kFloat64), torch::randn({4, 3}, torch::kFloat64),
                                [](const at::Tensor& o, const at::Tensor& t) { return o - t; });
              }),
              HasSubstr("the loss function must return a single-element tensor"));
}

TEST(Failures, AStageErrorReachesTheCallerAndThePipelineRecovers) {
  // Stage 2 of 4 fails on its third forward (micro-batch 2) of the first step.
  torch::manual_seed(1);
  torch::nn::Sequential model(torch::nn::Linear(8, 8), torch::nn::Tanh(), ThrowOnCall(2), torch::nn::Linear(8, 3));
  model->to(torch::kFloat64);
  auto reference = testing::clone_of(model);
  StageRunner pipe(model, PipelineOptions().workers(4).microbatches(4).schedule("1f1b"));
  const auto x = torch::randn({8, 8}, torch::kFloat64), y = torch::randn({8, 3}, torch::kFloat64);
  try {
    pipe.train_step(x, y, testing::mse);
    FAIL() << "expected an error";
  } catch (const PipelineError& e) {
    EXPECT_EQ(e.stage(), 2);
    EXPECT_EQ(e.microbatch(), 2);
    EXPECT_THAT(e.what(), HasSubstr("stage 2 failed in 2F2 (forward of micro-batch 2): layer 2"));
    EXPECT_THAT(e.what(), HasSubstr("injected failure"));
  }
  // Nothing is left over: the next step is exact.
  for (auto& p : pipe.parameters()) p.mutable_grad() = at::Tensor();
  pipe.train_step(x, y, testing::mse);
  testing::mse(reference->forward(x), y).backward();
  testing::expect_same_grads(pipe, reference, 1e-12, 0, "after a failed step");
}

TEST(Failures, AStalledStageTimesOutWithTheWaitNamed) {
  torch::nn::Sequential model(torch::nn::Linear(4, 4), Stall(600ms), torch::nn::Linear(4, 1));
  StageRunner pipe(model, PipelineOptions().boundaries({2}).microbatches(1).timeout(100ms));
  const auto start = std::chrono::steady_clock::now();
  const std::string error = error_of([&] {
    pipe.train_step(torch::randn({2, 4}), torch::randn({2, 1}), testing::mse);
  });
  EXPECT_THAT(error, HasSubstr("stage 1 failed in 1F0"));
  EXPECT_THAT(error,
              HasSubstr("stage 1 timed out after 100 ms waiting for the activation of micro-batch 0 from stage 0"));
  // The step returns once the stalled stage finishes its layer rather than
  // hanging on it: the bound rules out a hang, not a slow machine (a loaded
  // one under ThreadSanitizer takes seconds where an idle one takes 0.6 s).
  EXPECT_LT(std::chrono::steady_clock::now() - start, 60s);
}

TEST(Failures, MailboxSendIntoAFullChannelTimesOut) {
  Mailbox<int> box(1);
  const auto soon = [] { return std::chrono::steady_clock::now() + 50ms; };
  box.put(0, 10, soon(), [] { return std::string("first"); });
  EXPECT_THAT(error_of([&] { box.put(1, 11, soon(), [] { return std::string("channel to stage 1 stayed full"); }); }),
              HasSubstr("channel to stage 1 stayed full"));
  EXPECT_EQ(box.take(0, soon(), [] { return std::string("take"); }), 10);
  EXPECT_THAT(error_of([&] { box.take(3, soon(), [] { return std::string("nothing for micro-batch 3"); }); }),
              HasSubstr("nothing for micro-batch 3"));
  box.abort();
  EXPECT_THROW(box.take(0, soon(), [] { return std::string(); }), AbortedError);
}

}  // namespace
}  // namespace conveyor
