// The profiler, the planner's predictions against the runtime's counts, and
// the timeline pictures.
#include "error_of.h"
#include "test_models.h"

#include "plugin/measure/cpu_sharing.h"
#include "plugin/planner/planner.h"
#include "plugin/planner/profile.h"
#include "plugin/trace/timeline.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>
#include <unistd.h>

namespace conveyor {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::error_of;

ProfileOptions quick() { return ProfileOptions().warmup(0).repeats(1); }

TEST(Profile, MeasuresEveryLayerAndLeavesTheModelAsItWas) {
  auto mlp = testing::make_mlp();
  const at::Tensor x = torch::randn({6, 8}, torch::kFloat64), y = torch::randn({6, 3}, torch::kFloat64);
  const auto before = torch::get_default_dtype();
  torch::manual_seed(3);
  const at::Tensor expected_draw = torch::rand({4});
  torch::manual_seed(3);
  const ModelProfile p = profile_model(mlp, x, y, testing::mse, quick());
  EXPECT_TRUE(torch::equal(torch::rand({4}), expected_draw)) << "the random stream moved";
  for (const auto& param : mlp->parameters()) EXPECT_FALSE(param.grad().defined());
  EXPECT_EQ(torch::get_default_dtype(), before);

  ASSERT_EQ(p.layers.size(), 7u);
  EXPECT_EQ(p.batch_size, 6);
  EXPECT_EQ(p.input_bytes, 6 * 8 * 8);
  const int64_t widths[] = {16, 16, 16, 16, 8, 8, 3};
  for (size_t i = 0; i < 7; ++i) {
    EXPECT_EQ(p.layers[i].output_bytes, 6 * widths[i] * 8) << i;
    EXPECT_EQ(p.layers[i].output_grad_bytes, p.layers[i].output_bytes) << i;
    EXPECT_GT(p.layers[i].forward_seconds, 0.0) << i;
    EXPECT_GE(p.layers[i].forward_fixed, 0.0) << i;
    EXPECT_LE(p.layers[i].forward_fixed, p.layers[i].forward_seconds) << i;
  }
  EXPECT_EQ(p.layers[0].parameter_bytes, (8 * 16 + 16) * 8);
  EXPECT_EQ(p.layers[1].parameter_bytes, 0);
  EXPECT_THAT(p.layers[0].name, HasSubstr("torch::nn::Linear"));
  EXPECT_THAT(p.link.kind, HasSubstr("in-process handoff"));
  EXPECT_GT(p.action_overhead_seconds, 0.0);
  EXPECT_THAT(p.str(), HasSubstr("loss"));
}

// The optimizer's step is timed on copies of each layer's weights, and
// priced where the schedule pays it: after every backward of an
// asynchronous schedule, once after the flush of a synchronous one; so are
// the runtime's check of the gradients and its copies of the weights.
TEST(Profile, TimesTheOptimizerStepAndThePlanPaysItWhereTheScheduleDoes) {
  auto mlp = testing::make_mlp();
  const at::Tensor x = torch::randn({8, 8}, torch::kFloat64), y = torch::randn({8, 3}, torch::kFloat64);
  const auto before = testing::clone_of(mlp);
  const OptimizerFactory adam = [](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::Adam>(p); };
  ModelProfile p = profile_model(mlp, x.narrow(0, 0, 2), y.narrow(0, 0, 2), testing::mse, quick().optimizer(adam));
  for (size_t i = 0; i < p.layers.size(); ++i) {
    if (p.layers[i].parameter_bytes > 0) {
      EXPECT_GT(p.layers[i].update_seconds, 0.0) << i;
    } else {
      EXPECT_EQ(p.layers[i].update_seconds, 0.0) << i;
    }
  }
  for (size_t i = 0; i < mlp->parameters().size(); ++i) {  // the weights were not stepped
    EXPECT_TRUE(torch::equal(mlp->parameters()[i], before->parameters()[i])) << i;
  }
  for (const auto& l : p.layers) {  // the runtime's bookkeeping: a check of gradients, a copy of weights
    EXPECT_EQ(l.check_seconds > 0, l.parameter_bytes > 0) << l.name;
    EXPECT_EQ(l.copy_seconds > 0, l.parameter_bytes > 0) << l.name;
  }
  // Round numbers: every layer with weights takes 1 ms to step, 0.5 ms to
  // check and 0.25 ms to copy.
  for (auto& l : p.layers) {
    const bool weights = l.parameter_bytes > 0;
    l.update_seconds = weights ? 0.001 : 0.0;
    l.check_seconds = weights ? 0.0005 : 0.0;
    l.copy_seconds = weights ? 0.00025 : 0.0;
  }
  const auto profile = std::make_shared<ModelProfile>(p);
  const auto base = PipelineOptions().workers(2).microbatches(4).boundaries({4}).profile(profile);
  const Prediction unguarded = predict_step(mlp, PipelineOptions(base).schedule("1f1b").divergence_guard(false), 8);
  const Prediction plain = predict_step(mlp, PipelineOptions(base).schedule("1f1b"), 8);
  const Prediction stepped = predict_step(mlp, PipelineOptions(base).schedule("1f1b").optimizer(adam), 8);
  EXPECT_DOUBLE_EQ(unguarded.update_seconds, 0.0);
  EXPECT_DOUBLE_EQ(plain.update_seconds, 0.001);  // the guard's check of two layers' gradients after the flush
  EXPECT_DOUBLE_EQ(plain.step_seconds(), unguarded.step_seconds() + 0.001);
  EXPECT_DOUBLE_EQ(stepped.predicted[0].update_seconds, 0.003);  // layers 0 and 2, stepped and checked
  EXPECT_DOUBLE_EQ(stepped.predicted[1].update_seconds, 0.003);  // layers 4 and 6
  EXPECT_DOUBLE_EQ(stepped.update_seconds, 0.003);
  EXPECT_DOUBLE_EQ(stepped.step_seconds(), unguarded.step_seconds() + 0.003);
  EXPECT_THAT(stepped.str(), HasSubstr("update 3.00 ms"));
  // PipeDream: each of a stage's 4 backwards carries its update (step,
  // check, and the copy of the version it makes); the step first keeps every
  // stage's weights to roll back to (4 layers' copies).
  const Prediction async = predict_step(mlp, PipelineOptions(base).schedule("pipedream").optimizer(adam), 8);
  EXPECT_DOUBLE_EQ(async.update_seconds, 0.001);
  EXPECT_DOUBLE_EQ(async.predicted[1].update_seconds, 0.0035);
  EXPECT_DOUBLE_EQ(async.predicted[1].backward_seconds, plain.predicted[1].backward_seconds + 0.0035);
  EXPECT_GT(async.step_seconds(), unguarded.step_seconds() + 4 * 0.0035 - 1e-12);
  EXPECT_THAT(async.str(), HasSubstr("(with its update 3.50 ms)"));
}

// A CPU profile knows how many workers compute at once; a plan with more
// workers than that on the CPU makes them take turns.
// Each layer's forward is the time it takes within a pass through the model
// in order, as a stage runs it (weights loaded after the other layers'), not
// only alone: a layer that waits 3 ms is charged its 3 ms, and its neighbours
// are not.
TEST(Profile, LayersAreTimedWhereTheyRunInOrder) {
  torch::nn::Sequential model(torch::nn::Linear(8, 8), torch::nn::Functional([](const at::Tensor& x) {
                                std::this_thread::sleep_for(std::chrono::milliseconds(3));
                                return x * 2;
                              }),
                              torch::nn::Linear(8, 3));
  model->to(torch::kFloat64);
  const at::Tensor x = torch::randn({4, 8}, torch::kFloat64), y = torch::randn({4, 3}, torch::kFloat64);
  const ModelProfile p =
      profile_model(model, x, y, testing::mse, ProfileOptions().warmup(1).repeats(3).two_sizes(false));
  ASSERT_EQ(p.layers.size(), 3u);
  EXPECT_GE(p.layers[1].forward_seconds, 0.003);
  EXPECT_LT(p.layers[0].forward_seconds, p.layers[1].forward_seconds);
  EXPECT_LT(p.layers[2].forward_seconds, p.layers[1].forward_seconds);
  for (const auto& param : model->parameters()) EXPECT_FALSE(param.grad().defined());  // the passes left no gradient
}

// The slowdown measurement: threads that only wait do not slow each other;
// work that throws is reported, not a hang.
TEST(Profile, SlowdownOfThreadsThatDoNotCompeteIsNone) {
  // Sleeps of 10 ms, the median of 3 trials: a loaded machine's wake-up
  // latency (a few ms) stays well inside the factor 2.
  const std::vector<double> slowdown = measure_detail::measure_slowdown(
      [] { std::this_thread::sleep_for(std::chrono::milliseconds(10)); }, 4, 3, 3);
  ASSERT_EQ(slowdown.size(), 4u);
  EXPECT_EQ(slowdown[0], 1.0);
  EXPECT_LT(slowdown[3], 2.0);  // four sleepers at once take about as long as one
  std::atomic<int> calls{0};
  EXPECT_THAT(error_of([&] {
                measure_detail::measure_slowdown(
                    [&] {
                      if (++calls > 3) throw std::runtime_error("the work failed");
                    },
                    3, 2, 1);
              }),
              HasSubstr("the work failed"));
}

TEST(Profile, WorkersSharingTheProfiledCoresTakeTurns) {
  auto mlp = testing::make_mlp();
  const at::Tensor x = torch::randn({8, 8}, torch::kFloat64), y = torch::randn({8, 3}, torch::kFloat64);
  ModelProfile p = profile_model(mlp, x.narrow(0, 0, 2), y.narrow(0, 0, 2), testing::mse, quick().count_cores(true));
  EXPECT_GE(p.cores, 1);
  EXPECT_EQ(profile_model(mlp, x.narrow(0, 0, 2), y.narrow(0, 0, 2), testing::mse, quick()).cores, 0);
  EXPECT_THAT(p.str(), HasSubstr("workers compute at once"));
  // Measured too: how much longer each of n threads takes, n = 1 .. cores + 2.
  ASSERT_EQ(p.slowdown.size(), static_cast<size_t>(p.cores + 2));
  EXPECT_EQ(p.slowdown[0], 1.0);
  for (size_t n = 1; n < p.slowdown.size(); ++n) EXPECT_GE(p.slowdown[n], p.slowdown[n - 1]);
  for (int n = p.cores + 1; n <= p.cores + 2; ++n) EXPECT_GE(p.slowdown[n - 1], static_cast<double>(n) / p.cores);
  EXPECT_THAT(p.str(), HasSubstr("each slower by"));
  // And the runtime's cost per action when the workers outnumber the cores.
  EXPECT_GE(p.crowded_action_overhead_seconds, p.action_overhead_seconds);
  const std::vector<double> slowdown = p.slowdown;
  const double crowded = p.crowded_action_overhead_seconds;
  p.slowdown.clear();  // first the cores alone: a worker waits for a free one
  p.crowded_action_overhead_seconds = 0;
  for (auto& l : p.layers) l.check_seconds = 0;  // the step is the simulated actions alone
  const auto options = [&](int cores) {
    p.cores = cores;
    return PipelineOptions().workers(2).microbatches(4).schedule("1f1b").boundaries({4}).profile(
        std::make_shared<ModelProfile>(p));
  };
  const Prediction own = predict_step(mlp, options(0), 8), shared = predict_step(mlp, options(1), 8);
  double work = 0;
  for (double b : own.simulation.busy) work += b;
  EXPECT_LT(own.step_seconds(), work);  // the stages overlap
  // One core: every action in turn (and a transfer's wait where nothing else is ready).
  EXPECT_GE(shared.step_seconds(), work * (1 - 1e-12));
  EXPECT_LE(shared.step_seconds(), work + 2 * 4 * own.predicted[0].transfer_seconds + 1e-12);
  EXPECT_DOUBLE_EQ(predict_step(mlp, options(2), 8).step_seconds(), own.step_seconds());  // a core each
  // Crowded (2 workers, 1 core), each of the 16 actions pays the crowded
  // overhead in place of the plain one (less the transfers' waits the
  // longer actions now cover); with a core each, none does.
  p.crowded_action_overhead_seconds = p.action_overhead_seconds + 1e-3;
  EXPECT_GE(predict_step(mlp, options(1), 8).step_seconds(),
            shared.step_seconds() + 16e-3 - 2 * 4 * own.predicted[0].transfer_seconds - 1e-9);
  EXPECT_DOUBLE_EQ(predict_step(mlp, options(2), 8).step_seconds(), own.step_seconds());
  p.crowded_action_overhead_seconds = crowded;

  // With the slowdown the workers share the CPU: two at once each at half
  // speed is one core's work, end to end; at full speed, the plan's own.
  p.slowdown = {1.0, 2.0};
  const Prediction halved = predict_step(mlp, options(2), 8);
  EXPECT_GE(halved.step_seconds(), work * (1 - 1e-12));
  EXPECT_LE(halved.step_seconds(), work + 2 * 4 * own.predicted[0].transfer_seconds + 1e-12);
  p.slowdown = {1.0, 1.0};
  EXPECT_NEAR(predict_step(mlp, options(2), 8).step_seconds(), own.step_seconds(), 1e-12);
  p.slowdown = slowdown;  // as measured, a core each: between the two
  const double measured = predict_step(mlp, options(2), 8).step_seconds();
  EXPECT_GE(measured, own.step_seconds() * (1 - 1e-12));
  EXPECT_LE(measured, own.step_seconds() * slowdown[1] * (1 + 1e-12));
}

// The backward split as zero-bubble schedules run it is measured per layer
// (I to the layer's inputs, W to its weights), and a plan prices a
// zero-bubble schedule's I and W with it, whole backwards without it.
TEST(Profile, MeasuresTheSplitBackwardAndZeroBubblePlansPayIt) {
  torch::manual_seed(0);
  auto lm = testing::make_lstm_lm();  // embedding (integer input), LSTMs, linear
  const at::Tensor x = torch::randint(20, {4, 5}), y = torch::randint(20, {4, 5});
  ModelProfile p = profile_model(lm, x, y, testing::lm_loss, quick());
  EXPECT_EQ(p.layers[0].input_backward_seconds, 0.0);  // nothing before the embedding takes a gradient
  EXPECT_GT(p.layers[0].weight_backward_seconds, 0.0);
  for (size_t i = 1; i < p.layers.size(); ++i) {
    EXPECT_GT(p.layers[i].input_backward_seconds, 0.0) << i;
    EXPECT_EQ(p.layers[i].weight_backward_seconds > 0.0, p.layers[i].parameter_bytes > 0) << i;
  }
  // Round numbers: F = 1, B = 2; a split costs I = 1.5 and W = 1.5 (more than B).
  for (auto& l : p.layers) {
    l.forward_seconds = 1;
    l.backward_seconds = 2;
    l.input_backward_seconds = l.weight_backward_seconds = 1.5;
    l.forward_fixed = l.backward_fixed = 0;
    l.check_seconds = 0;  // no bookkeeping after the flush
  }
  p.loss_forward_seconds = p.loss_backward_seconds = p.action_overhead_seconds = 0;
  p.link = LinkProfile{};
  const auto options = [&](const char* schedule) {
    return PipelineOptions().workers(1).microbatches(1).schedule(schedule).profile(std::make_shared<ModelProfile>(p));
  };
  const double layers = static_cast<double>(p.layers.size());
  EXPECT_DOUBLE_EQ(predict_step(lm, options("zb-h1"), 4).step_seconds(), 4 * layers);     // F + I + W per layer
  EXPECT_DOUBLE_EQ(predict_step(lm, options("1f1b"), 4).step_seconds(), 3 * layers);      // F + B
  p.layers[2].input_backward_seconds = p.layers[2].weight_backward_seconds = 0;      // not measured: B halved
  EXPECT_DOUBLE_EQ(predict_step(lm, options("zb-h1"), 4).step_seconds(), 3 * layers);
}

TEST(Profile, RejectsWhatItCannotMeasure) {
  EXPECT_THAT(error_of([] {
                profile_model(torch::nn::Sequential(), torch::ones({2, 2}), torch::ones({2, 2}), testing::mse);
              }),
              HasSubstr("the model has no layers"));
  EXPECT_THAT(error_of([] {
                profile_model(testing::make_mlp(), torch::ones({4, 8}, torch::kFloat64),
                              torch::ones({4, 3}, torch::kFloat64), testing::mse,
                              ProfileOptions().batch_dim(2));
              }),
              HasSubstr("no input has samples along dimension 2"));
  EXPECT_THAT(error_of([] {
                profile_model(testing::make_mlp(), torch::ones({4, 8}, torch::kFloat64),
                              torch::ones({4, 3}, torch::kFloat64), testing::mse, ProfileOptions().sharing_stages(0));
              }),
              HasSubstr("repeats and sharing_stages must be positive"));
  EXPECT_THAT(error_of([] {
                profile_model(testing::make_mlp(), torch::ones({4, 5}, torch::kFloat64),
                              torch::ones({4, 3}, torch::kFloat64), testing::mse, quick());
              }),
              HasSubstr("layer 0"));
}

std::vector<Tensors> lm_batch(int64_t n) {
  return {{torch::randint(testing::kVocab, {n, 5})}, {torch::randint(testing::kVocab, {n, 5})}};
}

// Memory is deterministic: for every schedule, the predicted peak of stashed
// bytes and micro-batches in flight equal what the runtime reports, with
// uneven micro-batches (10 samples in 4: 3, 3, 2, 2), on 2 and 3 stages.
TEST(Predict, StashedBytesEqualTheRuntimesForEverySchedule) {
  const TensorsLossFn loss = [](const Tensors& out, const Tensors& t) { return testing::lm_loss(out[0], t[0]); };
  const auto sample = lm_batch(3);
  for (int stages : {2, 3}) {
    for (const std::string& schedule : schedules::schedule_names()) {
      if (schedules::default_chunks(schedule) > 1 && stages != 2) continue;  // 2 chunks each: 4 layers, M = 4
      torch::manual_seed(5);
      auto model = testing::make_lstm_lm();
      auto profile = std::make_shared<ModelProfile>(profile_model(model, sample[0], sample[1], loss, quick()));
      auto options = PipelineOptions().workers(stages).microbatches(4).schedule(schedule).balance(Balance::kTime)
                         .profile(profile);
      if (!schedules::make_schedule(schedule, stages, 4).synchronous()) {
        options.optimizer([](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, 0.01); });
      }
      const Prediction plan = predict_step(model, options, 10);
      StageRunner pipe(model, options);
      const auto batch = lm_batch(10);
      const StepResult r = pipe.train_step(batch[0], batch[1], loss);
      const std::string where = schedule + " K=" + std::to_string(stages);
      ASSERT_EQ(plan.split.str(), pipe.split().str()) << where;
      for (int k = 0; k < pipe.num_stages(); ++k) {  // every piece, with chunks
        EXPECT_EQ(plan.predicted[k].stash_bytes, r.peak_stash_bytes[k]) << where << " stage " << k;
        EXPECT_GT(plan.predicted[k].stash_bytes, 0) << where << " stage " << k;
        EXPECT_EQ(plan.predicted[k].peak_inflight, r.peak_inflight[k]) << where << " stage " << k;
      }
      EXPECT_THAT(plan.versus(r), HasSubstr("predicted vs measured"));
    }
  }
}

// Layers of several tensors: an integer mask rides along, gets no gradient,
// and the prediction still counts the stash exactly.
TEST(Predict, SeveralTensorLayersAreProfiledAndCountedToo) {
  const auto masked = [](Tensors t) { return Tensors{t[0] * t[1], t[1]}; };
  torch::nn::Sequential model(OnSlot(0, torch::nn::Linear(8, 8)), TensorsFunction(masked, "mask", 2),
                              OnSlot(0, torch::nn::ReLU()), OnSlot(0, torch::nn::Linear(8, 8)),
                              TensorsFunction([](Tensors t) { return Tensors{t[0]}; }, "drop the mask"),
                              torch::nn::Linear(8, 3));
  const TensorsLossFn loss = [](const Tensors& out, const Tensors& t) { return torch::mse_loss(out[0], t[0]); };
  const auto batch = [](int64_t n) {
    return std::vector<Tensors>{{torch::randn({n, 8}), torch::randint(2, {n, 8})}, {torch::randn({n, 3})}};
  };
  const auto sample = batch(2);
  auto profile = std::make_shared<ModelProfile>(profile_model(model, sample[0], sample[1], loss, quick()));
  EXPECT_EQ(profile->layers[1].output_bytes, 2 * 8 * 4 + 2 * 8 * 8);  // float32 values and int64 mask
  EXPECT_EQ(profile->layers[1].output_grad_bytes, 2 * 8 * 4);         // only the values get a gradient
  for (const char* schedule : {"1f1b", "fr"}) {
    auto options = PipelineOptions().workers(3).microbatches(3).schedule(schedule).balance(Balance::kTime)
                       .profile(profile);
    if (std::string(schedule) == "fr") {
      options.optimizer([](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, 0.01); });
    }
    const Prediction plan = predict_step(model, options, 7);
    StageRunner pipe(model, options);
    const auto b = batch(7);
    const StepResult r = pipe.train_step(b[0], b[1], loss);
    for (int k = 0; k < 3; ++k) EXPECT_EQ(plan.predicted[k].stash_bytes, r.peak_stash_bytes[k]) << schedule << k;
  }
}

TEST(Predict, AMadePlanNeedsTheModelsProfile) {
  EXPECT_THAT(error_of([&] { predict_step(testing::make_mlp(), PipelineOptions().workers(2), 32); }),
              HasSubstr("needs the model's profile"));
}

TEST(Timeline, SvgShowsEveryActionOfPredictedAndMeasuredSteps) {
  const auto s = schedules::make_1f1b(2, 3);
  const schedules::Simulation sim = simulate(s, schedules::StageCosts::uniform(2, 0.010, 0.020));
  StepResult measured;
  measured.wall_seconds = 0.2;
  for (const auto& row : sim.timeline) {
    measured.trace.emplace_back();
    for (const auto& t : row) measured.trace.back().push_back({t.action, t.start * 2e6, t.end * 2e6});
  }
  const std::vector<TimelineBlock> blocks = {timeline_block(sim, "predicted"), timeline_block(measured, "measured")};
  const std::string svg = timeline_svg(blocks);
  EXPECT_THAT(svg, HasSubstr("<svg"));
  EXPECT_THAT(svg, HasSubstr(">predicted</text>"));
  EXPECT_THAT(svg, HasSubstr(">measured</text>"));
  size_t forwards = 0, backwards = 0;
  for (size_t at = 0; (at = svg.find("fill=\"#4c78a8\"", at)) != std::string::npos; ++at) ++forwards;
  for (size_t at = 0; (at = svg.find("fill=\"#f58518\"", at)) != std::string::npos; ++at) ++backwards;
  EXPECT_EQ(forwards, 2u * 2 * 3 + 1);  // two blocks x 2 stages x 3 micro-batches, and the legend
  EXPECT_EQ(backwards, 2u * 2 * 3 + 1);

  const std::string path = (std::filesystem::temp_directory_path() /
                            ("conveyor_timeline_test_" + std::to_string(::getpid()) + ".svg"))
                               .string();
  write_timeline(path, blocks);
  std::ifstream written(path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(written), {}), svg);
  std::filesystem::remove(path);
  // No bitmap encoder in the library: a PNG path is refused, naming the ways to one.
  EXPECT_THAT(error_of([&] { write_timeline(path + ".png", blocks); }),
              AllOf(HasSubstr("must end in .svg"), HasSubstr("rsvg-convert"), HasSubstr("matplotlib")));
  EXPECT_THAT(error_of([] { StepResult().write_timeline("x.svg"); }), HasSubstr("no trace to draw"));
}

}  // namespace
}  // namespace conveyor
