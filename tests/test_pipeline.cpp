// The synchronous schedules give the unsplit model's gradients and loss, and
// report what they did (in-flight counts, stash bytes, trace).
#include "test_models.h"

#include <ATen/record_function.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <unistd.h>

namespace conveyor {
namespace {

using testing::kSyncSchedules;

struct Batch {
  at::Tensor input, target;
};

Batch mlp_batch(int64_t n, torch::Dtype dtype = torch::kFloat64) {
  return {torch::randn({n, 8}, dtype), torch::randn({n, 3}, dtype)};
}

Batch lm_batch(int64_t n, int64_t seq = 5) {
  return {torch::randint(testing::kVocab, {n, seq}), torch::randint(testing::kVocab, {n, seq})};
}

// Runs one step of `schedule` and one unsplit backward on a clone, then
// compares every gradient and the loss.
void check_exact(torch::nn::Sequential model, const Batch& batch, const LossFn& loss_fn, int stages, int microbatches,
                 const char* schedule, double abs_tol, double rel_tol) {
  auto reference = testing::clone_of(model);
  const at::Tensor ref_loss = loss_fn(reference->forward(batch.input), batch.target);
  ref_loss.backward();
  StageRunner pipe(model, PipelineOptions().workers(stages).microbatches(microbatches).schedule(schedule));
  const StepResult r = pipe.train_step(batch.input, batch.target, loss_fn);
  const std::string where =
      std::string(schedule) + " K=" + std::to_string(stages) + " M=" + std::to_string(microbatches);
  testing::expect_same_grads(pipe, reference, abs_tol, rel_tol, where);
  EXPECT_NEAR(r.loss, ref_loss.item<double>(), abs_tol + rel_tol * std::abs(ref_loss.item<double>())) << where;
}

TEST(PipelineExactness, MlpFloat64AllSchedulesStagesAndMicrobatches) {
  for (const char* schedule : kSyncSchedules) {
    for (int k = 1; k <= 4; ++k) {
      for (int m = 1; m <= 8; ++m) {
        torch::manual_seed(k * 100 + m);
        check_exact(testing::make_mlp(), mlp_batch(16), testing::mse, k, m, schedule, 1e-10, 0);
      }
    }
  }
}

TEST(PipelineExactness, LstmLanguageModelFloat64AllSchedulesStagesAndMicrobatches) {
  for (const char* schedule : kSyncSchedules) {
    for (int k = 1; k <= 4; ++k) {
      for (int m = 1; m <= 8; ++m) {
        torch::manual_seed(k * 100 + m);
        check_exact(testing::make_lstm_lm(), lm_batch(8), testing::lm_loss, k, m, schedule, 1e-10, 0);
      }
    }
  }
}

TEST(PipelineExactness, Float32WithinRelativeTolerance) {
  for (const char* schedule : kSyncSchedules) {
    for (int k : {2, 4}) {
      torch::manual_seed(k);
      check_exact(testing::make_mlp(torch::kFloat32), mlp_batch(24, torch::kFloat32), testing::mse, k, 6, schedule, 0,
                  1e-5);
      check_exact(testing::make_lstm_lm(torch::kFloat32), lm_batch(12), testing::lm_loss, k, 4, schedule, 0, 1e-5);
    }
  }
}

TEST(PipelineExactness, UnevenMicrobatchesAreWeightedBySize) {
  // 10 samples into 4 micro-batches of 3, 3, 2, 2: a plain mean of
  // micro-batch means would be wrong; weighting by size is exact.
  torch::manual_seed(7);
  check_exact(testing::make_mlp(), mlp_batch(10), testing::mse, 3, 4, "1f1b", 1e-10, 0);
  check_exact(testing::make_lstm_lm(), lm_batch(7), testing::lm_loss, 2, 3, "gpipe", 1e-10, 0);
}

TEST(PipelineExactness, SumReductionIsNotRescaled) {
  torch::manual_seed(8);
  auto model = testing::make_mlp();
  auto reference = testing::clone_of(model);
  const Batch b = mlp_batch(12);
  const LossFn sum_loss = [](const at::Tensor& o, const at::Tensor& t) { return (o - t).pow(2).sum(); };
  sum_loss(reference->forward(b.input), b.target).backward();
  StageRunner pipe(model, PipelineOptions().workers(2).microbatches(5).loss_reduction(LossReduction::kSum));
  pipe.train_step(b.input, b.target, sum_loss);
  testing::expect_same_grads(pipe, reference, 1e-10, 0, "sum reduction");
}

TEST(PipelineTraining, SgdStepsMatchTheUnsplitModelAndLossFalls) {
  torch::manual_seed(9);
  auto model = testing::make_mlp();
  auto reference = testing::clone_of(model);
  StageRunner pipe(model, PipelineOptions().workers(3).microbatches(4).schedule("1f1b"));
  torch::optim::SGD opt(pipe.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  Batch b = mlp_batch(32);
  b.target = torch::tanh(b.input.narrow(1, 0, 3));  // learnable, unlike noise
  double first = 0, last = 0;
  for (int step = 0; step < 40; ++step) {
    opt.zero_grad();
    last = pipe.train_step(b.input, b.target, testing::mse).loss;
    if (step == 0) first = last;
    opt.step();
    ref_opt.zero_grad();
    testing::mse(reference->forward(b.input), b.target).backward();
    ref_opt.step();
  }
  EXPECT_LT(last, 0.3 * first);
  const auto ref = reference->named_parameters();
  for (const auto& [name, p] : pipe.named_parameters()) {
    EXPECT_LE((p - *ref.find(name)).abs().max().item<double>(), 1e-10) << name;
  }
}

TEST(PipelineApi, SharesTheModelsLayersAndKeepsTheirNames) {
  auto model = testing::make_mlp();
  const auto original = model->named_parameters();
  StageRunner pipe(model, PipelineOptions().workers(3));
  const auto named = pipe.named_parameters();
  ASSERT_EQ(named.size(), original.size());
  for (const auto& [name, p] : named) {
    ASSERT_NE(original.find(name), nullptr) << name;
    EXPECT_EQ(p.data_ptr(), original.find(name)->data_ptr()) << name;
  }
  EXPECT_EQ(pipe.parameters().size(), original.size());
  EXPECT_EQ(pipe.stage(1).first_layer(), 3);
}

TEST(PipelineApi, ForwardIsInferenceAndMatchesTheModel) {
  torch::manual_seed(10);
  auto model = testing::make_lstm_lm();
  auto reference = testing::clone_of(model);
  StageRunner pipe(model, PipelineOptions().workers(4).microbatches(3));
  const at::Tensor x = torch::randint(testing::kVocab, {7, 6});
  const at::Tensor out = pipe.forward(x);
  EXPECT_FALSE(out.requires_grad());
  EXPECT_LE((out - reference->forward(x)).abs().max().item<double>(), 1e-12);
  // Fewer samples than micro-batches is fine for inference.
  EXPECT_EQ(pipe.forward(x.slice(0, 0, 2)).size(0), 2);
}

TEST(PipelineStats, InflightCountsFollowTheSchedule) {
  const int k_stages = 4, m = 8;
  for (const char* schedule : {"gpipe", "1f1b", "sequential"}) {
    torch::manual_seed(11);
    StageRunner pipe(testing::make_mlp(), PipelineOptions().workers(k_stages).microbatches(m).schedule(schedule));
    const Batch b = mlp_batch(32);
    const StepResult r = pipe.train_step(b.input, b.target, testing::mse);
    ASSERT_EQ(r.peak_inflight.size(), static_cast<size_t>(k_stages));
    for (int k = 0; k < k_stages; ++k) {
      const int expected = std::string(schedule) == "gpipe"  ? m
                           : std::string(schedule) == "1f1b" ? std::min(m, k_stages - k)
                                                             : 1;
      EXPECT_EQ(r.peak_inflight[k], expected) << schedule << " stage " << k;
      EXPECT_GT(r.peak_stash_bytes[k], 0) << schedule << " stage " << k;
    }
    EXPECT_GE(r.bubble_fraction, 0.0);
    EXPECT_LT(r.bubble_fraction, 1.0);
    EXPECT_GT(r.wall_seconds, 0.0);
  }
}

TEST(PipelineStats, StashBytesCountBoundaryTensorsOfLiveMicrobatches) {
  // Stage 1 of a 2-stage GPipe over Linear(8,16) | Linear(16,4), 8 samples in
  // 4 micro-batches: it holds all 4 inputs (2x16 doubles) and outputs (2x4).
  torch::nn::Sequential m(torch::nn::Linear(8, 16), torch::nn::Linear(16, 4));
  m->to(torch::kFloat64);
  StageRunner pipe(m, PipelineOptions().workers(2).microbatches(4).schedule("gpipe"));
  const StepResult r =
      pipe.train_step(torch::randn({8, 8}, torch::kFloat64), torch::randn({8, 4}, torch::kFloat64), testing::mse);
  EXPECT_EQ(r.peak_stash_bytes[1], 4 * (2 * 16 + 2 * 4) * 8);
  EXPECT_EQ(r.peak_stash_bytes[0], 4 * (2 * 16) * 8);  // outputs only: stage 0's input needs no gradient
}

TEST(PipelineStats, TraceHasOneEventPerActionAndWritesChromeJson) {
  StageRunner pipe(testing::make_mlp(), PipelineOptions().workers(3).microbatches(4).schedule("1f1b"));
  const Batch b = mlp_batch(8);
  const StepResult r = pipe.train_step(b.input, b.target, testing::mse);
  ASSERT_EQ(r.trace.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    ASSERT_EQ(r.trace[k].size(), pipe.schedule().workers[k].size());
    for (size_t i = 0; i < r.trace[k].size(); ++i) {
      EXPECT_EQ(r.trace[k][i].action, pipe.schedule().workers[k][i]);
      EXPECT_LE(r.trace[k][i].start_us, r.trace[k][i].end_us);
      if (i) {
        EXPECT_LE(r.trace[k][i - 1].end_us, r.trace[k][i].start_us);
      }
    }
  }
  const auto path =
      std::filesystem::temp_directory_path() / ("conveyor_trace_test_" + std::to_string(::getpid()) + ".json");
  r.write_chrome_trace(path.string());
  std::ifstream in(path);
  const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t events = 0;
  for (size_t at = json.find("\"ph\":\"X\""); at != std::string::npos; at = json.find("\"ph\":\"X\"", at + 1)) ++events;
  EXPECT_EQ(events, 2u * 3 * 4);
  EXPECT_NE(json.find("\"name\":\"2B3\""), std::string::npos);
  std::filesystem::remove(path);
}

// The stages run under the caller's thread-local state: a record-function
// callback (what torch.profiler installs) added on the calling thread sees
// the stages' ops, and only while it is installed.
std::atomic<int> linear_calls{0};

std::unique_ptr<at::ObserverContext> count_linear(const at::RecordFunction& fn) {
  if (std::string(fn.name()) == "aten::addmm") ++linear_calls;  // torch::nn::Linear on 2-D input
  return nullptr;
}

TEST(PipelineApi, StagesRunUnderTheCallersThreadLocalState) {
  StageRunner pipe(testing::make_mlp(), PipelineOptions().workers(2).microbatches(3).schedule("1f1b"));
  const Batch batch = mlp_batch(6);
  linear_calls = 0;
  {
    const at::CallbackHandle handle =
        at::addThreadLocalCallback(at::RecordFunctionCallback(&count_linear).needsInputs(false));
    pipe.train_step(batch.input, batch.target, testing::mse);
    at::removeCallback(handle);
  }
  EXPECT_EQ(linear_calls.load(), 4 * 3);  // 4 Linear layers, 3 micro-batches, forward once each
  pipe.train_step(batch.input, batch.target, testing::mse);
  EXPECT_EQ(linear_calls.load(), 4 * 3);
}

TEST(PipelineApi, CustomScheduleTextRuns) {
  // GPipe with backwards in reverse order: valid, and still exact.
  const std::string text =
      "# schedule custom stages=2 microbatches=2\n"
      "0F0 0F1 0B1 0B0\n"
      "1F0 1F1 1B1 1B0\n";
  torch::manual_seed(12);
  auto model = testing::make_mlp();
  auto reference = testing::clone_of(model);
  const Batch b = mlp_batch(6);
  testing::mse(reference->forward(b.input), b.target).backward();
  StageRunner pipe(model, PipelineOptions().workers(2).microbatches(2).schedule_text(text));
  pipe.train_step(b.input, b.target, testing::mse);
  testing::expect_same_grads(pipe, reference, 1e-10, 0, "custom schedule");
}

}  // namespace
}  // namespace conveyor
