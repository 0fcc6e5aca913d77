// The asynchronous methods run by the pipeline equal, bit for bit in float64,
// a sequential reference written from each method's definition; they keep
// what the seed study's table says they keep; and they stop cleanly when
// training diverges.
#include "reference_trainer.h"
#include "test_models.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;
using testing::Method;

using testing::MethodCase;

OptimizerFactory sgd_momentum() {
  return [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.05).momentum(0.9));
  };
}

OptimizerFactory adam() {
  return [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(0.01));
  };
}

std::string label(const MethodCase& m, int k) {
  return std::string(m.schedule) + (m.vertical_sync ? "+vertical-sync" : "") + " K=" + std::to_string(k);
}

// 20 train_steps of M mini-batches; after each, every parameter equals the
// reference's exactly.
void check_against_reference(const MethodCase& m, int k, const OptimizerFactory& optimizer,
                             const LearningRateSchedule& lr = nullptr) {
  torch::manual_seed(100 + k);
  auto model = testing::make_mlp();
  auto reference_model = testing::clone_of(model);
  const int microbatches = k + 2;
  auto options = PipelineOptions()
                     .workers(k)
                     .microbatches(microbatches)
                     .schedule(m.schedule)
                     .vertical_sync(m.vertical_sync)
                     .optimizer(optimizer);
  if (lr) options.lr_schedule(lr).lr_schedule_unit(UpdateUnit::kMicrobatch);
  StageRunner pipe(model, options);
  testing::ReferenceTrainer reference(testing::split_like_pipeline(reference_model, k), m.reference, optimizer, lr);
  for (int step = 0; step < 20; ++step) {
    const at::Tensor x = torch::randn({3 * microbatches, 8}, torch::kFloat64);
    const at::Tensor y = torch::tanh(x.narrow(1, 0, 3));
    const StepResult r = pipe.train_step(x, y, testing::mse);
    ASSERT_EQ(r.updates, std::vector<int>(k, microbatches)) << label(m, k);
    reference.step(x.tensor_split(microbatches), y.tensor_split(microbatches), testing::mse);
    const auto ref = reference_model->named_parameters();
    for (const auto& [name, p] : pipe.named_parameters()) {
      ASSERT_TRUE(torch::equal(p, *ref.find(name))) << label(m, k) << " step " << step << ": " << name << " differs by "
                                                    << (p - *ref.find(name)).abs().max().item<double>();
    }
  }
  // Between steps the model's own parameters hold the live weights.
  const auto live = pipe.named_parameters();
  for (const auto& p : model->named_parameters()) {
    const auto it = std::find_if(live.begin(), live.end(), [&](const auto& e) { return e.first == p.key(); });
    ASSERT_NE(it, live.end());
    EXPECT_TRUE(torch::equal(p.value(), it->second)) << label(m, k) << ": model parameter " << p.key();
  }
}

TEST(AsyncExactness, EveryMethodEqualsItsReferenceWithSgdMomentum) {
  for (const auto& m : testing::kAsyncMethods) {
    for (int k = 2; k <= 4; ++k) check_against_reference(m, k, sgd_momentum());
  }
}

TEST(AsyncExactness, EveryMethodEqualsItsReferenceWithAdam) {
  for (const auto& m : testing::kAsyncMethods) {
    for (int k = 2; k <= 4; ++k) check_against_reference(m, k, adam());
  }
}

TEST(AsyncExactness, PerUpdateLearningRateSchedule) {
  const LearningRateSchedule decay = [](int64_t n) { return 0.1 / (1.0 + 0.05 * static_cast<double>(n)); };
  for (const auto& m : testing::kAsyncMethods) check_against_reference(m, 3, sgd_momentum(), decay);
}

// The seed's table for 1-based stage k: K-k+1 states (DDG, PipeDream) or
// inputs (FR); for 0-based k that is K-k.
TEST(AsyncStorage, WhatEachStageKeeps) {
  const int k_stages = 4, m = 10;
  for (const char* name : {"pipedream", "ddg", "fr"}) {
    torch::manual_seed(3);
    StageRunner pipe(testing::make_mlp(),
                  PipelineOptions().workers(k_stages).microbatches(m).schedule(name).optimizer(sgd_momentum()));
    const at::Tensor x = torch::randn({20, 8}, torch::kFloat64);
    const StepResult r = pipe.train_step(x, torch::tanh(x.narrow(1, 0, 3)), testing::mse);
    const bool replay = std::string(name) == "fr";
    for (int k = 0; k < k_stages; ++k) {
      EXPECT_EQ(r.peak_inflight[k], k_stages - k) << name << " stage " << k;
      EXPECT_EQ(r.peak_stashed_activations[k], replay ? 0 : k_stages - k) << name << " stage " << k;
      EXPECT_EQ(r.peak_stashed_inputs[k], replay ? k_stages - k : 0) << name << " stage " << k;
      // Weight stashing keeps one version per in-flight micro-batch; replay keeps none.
      EXPECT_EQ(r.peak_weight_versions[k], replay ? 0 : r.peak_inflight[k]) << name << " stage " << k;
    }
  }
  // Vertical sync: stage k's in-flight micro-batches hold K-k versions and the
  // k versions it has made since, which later forwards will read, are kept
  // too: K on every stage.
  StageRunner vs(testing::make_mlp(), PipelineOptions()
                                       .workers(k_stages)
                                       .microbatches(m)
                                       .schedule("pipedream")
                                       .vertical_sync(true)
                                       .optimizer(sgd_momentum()));
  const at::Tensor x = torch::randn({20, 8}, torch::kFloat64);
  const StepResult r = vs.train_step(x, torch::tanh(x.narrow(1, 0, 3)), testing::mse);
  for (int k = 0; k < k_stages; ++k) EXPECT_EQ(r.peak_weight_versions[k], k_stages) << "vertical sync stage " << k;
  // Synchronous schedules stash activations and no weights.
  StageRunner sync(testing::make_mlp(), PipelineOptions().workers(k_stages).microbatches(m).schedule("1f1b"));
  const StepResult s = sync.train_step(x, torch::tanh(x.narrow(1, 0, 3)), testing::mse);
  for (int k = 0; k < k_stages; ++k) {
    EXPECT_EQ(s.peak_weight_versions[k], 0);
    EXPECT_EQ(s.updates[k], 0);
  }
}

// A non-finite loss part-way through a step: an error naming step, stage and
// method, and the weights and optimizer state of the last good step.
TEST(AsyncDivergence, EveryMethodStopsAndKeepsTheLastGoodStep) {
  const int k_stages = 3, m = 4;
  for (const char* name : {"pipedream", "ddg", "fr", "1f1b"}) {
    torch::manual_seed(5);
    auto model = testing::make_mlp();
    auto twin = testing::clone_of(model);
    const auto options = PipelineOptions().workers(k_stages).microbatches(m).schedule(name).optimizer(sgd_momentum());
    StageRunner pipe(model, options), clean(twin, options);
    std::vector<at::Tensor> xs;
    for (int i = 0; i < 4; ++i) xs.push_back(torch::randn({8, 8}, torch::kFloat64));
    const auto target = [](const at::Tensor& x) { return torch::tanh(x.narrow(1, 0, 3)); };
    for (int i = 0; i < 2; ++i) {
      pipe.train_step(xs[i], target(xs[i]), testing::mse);
      clean.train_step(xs[i], target(xs[i]), testing::mse);
    }
    // The last mini-batch of step 3 holds a NaN: earlier ones have updated by then.
    at::Tensor bad = xs[2].clone();
    bad.index_put_({7, 0}, std::nan(""));
    try {
      pipe.train_step(bad, target(xs[2]), testing::mse);
      FAIL() << name << ": expected a DivergenceError";
    } catch (const DivergenceError& e) {
      EXPECT_EQ(e.step(), 3) << name;
      EXPECT_EQ(e.schedule(), name);
      EXPECT_EQ(e.stage(), k_stages - 1) << name;
      EXPECT_EQ(e.microbatch(), 3) << name;
      EXPECT_THAT(e.what(), HasSubstr(std::string("training diverged at step 3 of schedule '") + name +
                                      "': stage 2 has a non-finite loss (1 element) in 2F3 (micro-batch 3)"));
    }
    EXPECT_EQ(pipe.completed_steps(), 2);
    // Nothing of the failed step remains: the next steps match a run that never saw it.
    for (int i = 2; i < 4; ++i) {
      pipe.train_step(xs[i], target(xs[i]), testing::mse);
      clean.train_step(xs[i], target(xs[i]), testing::mse);
    }
    const auto a = pipe.named_parameters(), b = clean.named_parameters();
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << name << " " << a[i].first;
  }
}

TEST(AsyncDivergence, ALargeLearningRateIsCaught) {
  torch::manual_seed(6);
  StageRunner pipe(
      testing::make_mlp(),
      PipelineOptions().workers(2).microbatches(4).schedule("pipedream").optimizer([](std::vector<at::Tensor> p) {
        return std::make_unique<torch::optim::SGD>(p, 1e6);
      }));
  const at::Tensor x = torch::randn({8, 8}, torch::kFloat64) * 100;
  try {
    for (int i = 0; i < 50; ++i) pipe.train_step(x, x.narrow(1, 0, 3) * 1e3, testing::mse);
    FAIL() << "expected training to diverge";
  } catch (const DivergenceError& e) {
    EXPECT_THAT(e.what(), HasSubstr("of schedule 'pipedream'"));
    EXPECT_THAT(e.what(), HasSubstr("the weights of the last good step are kept"));
    for (const auto& p : pipe.parameters()) EXPECT_TRUE(torch::isfinite(p).all().item<bool>());
  }
}

TEST(AsyncBadInput, ClearErrors) {
  const auto mlp = testing::make_mlp();
  const auto error_of = [&](const PipelineOptions& o) -> std::string {
    try {
      StageRunner(mlp, o);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "<no error>";
  };
  EXPECT_THAT(error_of(PipelineOptions().workers(2).microbatches(4).schedule("ddg")),
              HasSubstr("schedule 'ddg' steps the optimizer after every micro-batch on every stage, so the pipeline "
                        "needs its own: give the option optimizer (a name with lr, or a factory)"));
  EXPECT_THAT(error_of(PipelineOptions().workers(4).microbatches(2).schedule("pipedream").optimizer(sgd_momentum())),
              HasSubstr("pipedream with 2 micro-batches cannot fill a 4-stage pipeline: give at least 4"));
  EXPECT_THAT(error_of(PipelineOptions().workers(2).microbatches(4).schedule("fr").vertical_sync(true).optimizer(
                  sgd_momentum())),
              HasSubstr("only pipedream has vertical sync"));
  const LearningRateSchedule lr = [](int64_t) { return 0.1; };
  // Unset, the unit is the schedule's; set to the other, an error.
  EXPECT_EQ(
      error_of(PipelineOptions().workers(2).microbatches(4).schedule("pipedream").optimizer(sgd_momentum()).lr_schedule(
          lr)),
      "<no error>");
  EXPECT_THAT(error_of(PipelineOptions()
                           .workers(2)
                           .microbatches(4)
                           .schedule("pipedream")
                           .optimizer(sgd_momentum())
                           .lr_schedule(lr)
                           .lr_schedule_unit(UpdateUnit::kBatch)),
              HasSubstr("updates the weights after every micro-batch, but the learning-rate schedule counts batches"));
  EXPECT_THAT(error_of(PipelineOptions()
                           .workers(2)
                           .microbatches(4)
                           .schedule("gpipe")
                           .optimizer(sgd_momentum())
                           .lr_schedule(lr)
                           .lr_schedule_unit(UpdateUnit::kMicrobatch)),
              HasSubstr("updates the weights once per batch, but the learning-rate schedule counts micro-batches"));
  EXPECT_THAT(error_of(PipelineOptions().workers(2).microbatches(4).lr_schedule(lr)),
              HasSubstr("lr_schedule needs the pipeline's own optimizer"));
}

TEST(SyncOptimizer, ThePipelinesOwnOptimizerStepsOncePerBatch) {
  torch::manual_seed(7);
  auto model = testing::make_mlp();
  auto reference = testing::clone_of(model);
  StageRunner pipe(model, PipelineOptions().workers(3).microbatches(4).schedule("gpipe").optimizer(adam()));
  auto ref_opt = adam()(reference->parameters());
  for (int step = 0; step < 5; ++step) {
    const at::Tensor x = torch::randn({8, 8}, torch::kFloat64), y = torch::tanh(x.narrow(1, 0, 3));
    const StepResult r = pipe.train_step(x, y, testing::mse);
    EXPECT_EQ(r.updates, std::vector<int>(3, 1));
    testing::mse(reference->forward(x), y).backward();
    ref_opt->step();
    ref_opt->zero_grad(true);
  }
  const auto ref = reference->named_parameters();
  for (const auto& [name, p] : pipe.named_parameters()) {
    EXPECT_LE((p - *ref.find(name)).abs().max().item<double>(), 1e-12) << name;
    EXPECT_FALSE(p.grad().defined()) << name << ": the pipeline clears gradients after its step";
  }
}

}  // namespace
}  // namespace conveyor
