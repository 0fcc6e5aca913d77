// Faults injected at random points of an in-process step (a stage that
// throws, a loss that turns NaN, a stage that stalls past the timeout): the
// caller gets an error naming the cause, the weights and optimizer state are
// those of the step before, and training goes on as if the failed step had
// never been taken. Points are drawn from a seed per case; counts, not timings.
#include "error_of.h"
#include "fault_plans.h"
#include "test_models.h"

#include <atomic>
#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace conveyor::testing {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr int kStages = 3;
constexpr int kMicrobatches = 4;
// Every pipeline here waits at most 1 s: long enough that no ordinary action
// outlasts it on a loaded machine under ThreadSanitizer (where one backward
// once took longer than 200 ms), short enough that a stall of a few of it is
// quick to test.
constexpr auto kTimeout = 1000ms;
const std::string kTimedOut = "timed out after " + std::to_string(kTimeout.count()) + " ms";
// A stall outlasts the timeout by twice the timeout, so that the neighbour
// that waits on it gives up first however late its own wait began.
constexpr auto kStall = 3 * kTimeout;

struct Batch {
  at::Tensor x, y;
};

Batch batch(int step) {
  torch::manual_seed(1000 + step);
  return {torch::randn({8, 8}, torch::kFloat64), torch::randn({8, 3}, torch::kFloat64)};
}

bool asynchronous(const std::string& schedule) { return schedule == "pipedream" || schedule == "ddg"; }

// SGD with momentum and a learning rate that depends on the update count, so
// that a failed step that left gradients, momentum or counts behind shows.
PipelineOptions options_for(const std::string& schedule) {
  return PipelineOptions()
      .workers(kStages)
      .microbatches(kMicrobatches)
      .schedule(schedule)
      .timeout(kTimeout)
      .optimizer([](std::vector<at::Tensor> p) {
        return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.05).momentum(0.9));
      })
      .lr_schedule([](int64_t update) { return 0.05 / (1.0 + 0.1 * static_cast<double>(update)); })
      .lr_schedule_unit(asynchronous(schedule) ? UpdateUnit::kMicrobatch : UpdateUnit::kBatch);
}

std::unique_ptr<StageRunner> seeded_pipeline(const std::string& schedule) {
  torch::manual_seed(0);
  return std::make_unique<StageRunner>(make_mlp(), options_for(schedule));
}

// Everything a step may change: the weights, each stage's momentum buffers
// and update count, and the gradients (none between steps: the pipeline's
// own optimizer clears them).
struct State {
  std::vector<at::Tensor> weights, momentum, grads;
  std::vector<int64_t> updates;
};

State state_of(const StageRunner& pipe) {
  State s;
  for (const auto& p : pipe.parameters()) {
    s.weights.push_back(p.detach().clone());
    s.grads.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
  }
  for (int k = 0; k < pipe.num_stages(); ++k) {
    torch::optim::Optimizer& opt = *pipe.stage(k).optimizer();
    s.updates.push_back(pipe.stage(k).updates());
    for (const auto& group : opt.param_groups()) {
      for (const auto& p : group.params()) {
        const auto it = opt.state().find(p.unsafeGetTensorImpl());
        s.momentum.push_back(it == opt.state().end()
                                 ? at::Tensor()
                                 : static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer().clone());
      }
    }
  }
  return s;
}

void expect_same_tensors(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want,
                         const std::string& what, const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where << ": " << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].defined(), want[i].defined()) << where << ": " << what << " " << i;
    if (got[i].defined()) {
      EXPECT_TRUE(torch::equal(got[i], want[i])) << where << ": " << what << " " << i << " differs";
    }
  }
}

void expect_same_state(const State& got, const State& want, const std::string& where) {
  expect_same_tensors(got.weights, want.weights, "weight", where);
  expect_same_tensors(got.momentum, want.momentum, "momentum buffer", where);
  expect_same_tensors(got.grads, want.grads, "gradient", where);
  EXPECT_EQ(got.updates, want.updates) << where << ": update counts";
}

void train(StageRunner& pipe, int step) {
  const Batch b = batch(step);
  pipe.train_step(b.x, b.y, mse);
}

// The error a fault must produce, by kind.
void expect_error_names_the_fault(const std::string& message, const FaultPlan& plan,
                                  const schedules::Schedule& schedule, const std::string& where) {
  switch (plan.kind) {
    case FaultKind::kThrow: {
      const std::string action = schedule.workers[plan.stage][plan.action].str();
      EXPECT_THAT(message, HasSubstr("conveyor: stage " + std::to_string(plan.stage) + " failed in " + action))
          << where;
      EXPECT_THAT(message, HasSubstr("injected fault in " + action)) << where;
      break;
    }
    case FaultKind::kNan:
      EXPECT_THAT(message, HasSubstr("training diverged at step 3 of schedule '" + schedule.name + "': stage " +
                                     std::to_string(kStages - 1) + " has a non-finite loss (1 element)"))
          << where;
      EXPECT_THAT(message, HasSubstr("(micro-batch " + std::to_string(plan.microbatch) + ")")) << where;
      break;
    case FaultKind::kStall: {
      const std::string stalled = std::to_string(plan.stage);
      EXPECT_THAT(message, HasSubstr(kTimedOut)) << where;
      // The stage that waited on it names it, or names the stage between,
      // and then the stalled one as busy meanwhile.
      const std::string action = schedule.workers[plan.stage][plan.action].str();
      EXPECT_THAT(message, AnyOf(HasSubstr("from stage " + stalled), HasSubstr("to stage " + stalled),
                                 HasSubstr("stage " + stalled + " in " + action + " (")))
          << where;
      break;
    }
    default:
      FAIL() << where << ": no fault";
  }
}

// Two good steps, a third with one fault, then a fourth: the fault's error
// names it, the third step changes nothing, and the fourth gives what a run
// that skipped the third gives.
void run_case(const std::string& schedule, FaultKind kind, uint32_t seed) {
  auto pipe = seeded_pipeline(schedule);
  std::mt19937 rng(seed);
  const FaultPlan plan = draw_fault(kind, pipe->schedule(), rng, kStall);
  const std::string where = schedule + " " + fault_kind_name(kind) + " seed " + std::to_string(seed) + " (stage " +
                            std::to_string(plan.stage) + ", action " + std::to_string(plan.action) +
                            ", micro-batch " + std::to_string(plan.microbatch) + ")";
  train(*pipe, 0);
  train(*pipe, 1);
  const State before = state_of(*pipe);
  PlannedFaults faults;
  std::string message;
  {
    FaultInjectionScope scope(faults);
    faults.arm(plan);
    message = error_of<PipelineError>([&] { train(*pipe, 2); });
    faults.disarm();
  }
  ASSERT_TRUE(faults.fired()) << where;
  expect_error_names_the_fault(message, plan, pipe->schedule(), where);
  expect_same_state(state_of(*pipe), before, where + ", after the failed step");
  EXPECT_EQ(pipe->completed_steps(), 2) << where;

  train(*pipe, 3);
  auto reference = seeded_pipeline(schedule);
  for (int step : {0, 1, 3}) train(*reference, step);
  expect_same_state(state_of(*pipe), state_of(*reference), where + ", the step after");
}

class InProcessFaults : public ::testing::TestWithParam<std::string> {};

TEST_P(InProcessFaults, AStageThatThrowsOnARandomActionFailsOnlyThatStep) {
  for (uint32_t seed = 1; seed <= 8; ++seed) run_case(GetParam(), FaultKind::kThrow, seed);
}

TEST_P(InProcessFaults, ALossThatTurnsNanOnARandomMicrobatchFailsOnlyThatStep) {
  for (uint32_t seed = 1; seed <= 4; ++seed) run_case(GetParam(), FaultKind::kNan, seed);
}

TEST_P(InProcessFaults, AStageThatStallsPastTheTimeoutFailsOnlyThatStep) {
  for (uint32_t seed = 1; seed <= 3; ++seed) run_case(GetParam(), FaultKind::kStall, seed);
}

INSTANTIATE_TEST_SUITE_P(Schedules, InProcessFaults, ::testing::Values("gpipe", "1f1b", "pipedream"),
                         [](const auto& info) { return info.param; });

// A stall in a send (a neighbour whose channel stays full or empty) is the
// same: the waiting stage names the one it waited for.
TEST(InProcessFaults, AStallInsideASendTimesOutItsNeighbour) {
  struct StallSend : FaultInjector {
    void before_send(Channel channel, int from, int, int mb, int64_t*) override {
      if (channel == Channel::kActivation && from == 1 && mb == 1) std::this_thread::sleep_for(kStall);
    }
  } stall;
  auto pipe = seeded_pipeline("1f1b");
  train(*pipe, 0);
  const State before = state_of(*pipe);
  std::string message;
  {
    FaultInjectionScope scope(stall);
    message = error_of<PipelineError>([&] { train(*pipe, 1); });
  }
  // Stage 2 waits for that activation, stage 0 for the gradient stage 1
  // sends after it; whichever gives up first is reported.
  EXPECT_THAT(message, AnyOf(HasSubstr("stage 2 " + kTimedOut + " waiting for the activation of micro-batch 1 "
                                                 "from stage 1"),
                             HasSubstr("stage 0 " + kTimedOut + " waiting for the gradient of micro-batch 0 "
                                                 "from stage 1")));
  expect_same_state(state_of(*pipe), before, "after the stalled step");
}

// Under DDG the stages meet at lock-step barriers; a stage stalled before
// one keeps the others waiting there, and the timeout is a PipelineError
// that names the barrier or the message it waited for, like any other wait.
TEST(InProcessFaults, AStallBeforeALockStepBarrierFailsTheStepWithItsName) {
  struct StallBeforeBarrier : FaultInjector {
    size_t position = 0;
    std::atomic<int> seen{0};
    void before_action(int stage, const schedules::Action&) override {
      if (stage == 1 && static_cast<size_t>(seen++) + 1 == position) std::this_thread::sleep_for(kStall);
    }
  } stall;
  auto pipe = seeded_pipeline("ddg");
  ASSERT_FALSE(pipe->schedule().barriers.empty());
  ASSERT_FALSE(pipe->schedule().barriers[1].empty());
  stall.position = pipe->schedule().barriers[1].front();  // stage 1's action before its first barrier
  train(*pipe, 0);
  const State before = state_of(*pipe);
  std::string message;
  {
    FaultInjectionScope scope(stall);
    message = error_of<PipelineError>([&] { train(*pipe, 1); });
  }
  EXPECT_THAT(message, HasSubstr(kTimedOut));
  EXPECT_THAT(message, AnyOf(HasSubstr("failed at lock-step barrier 0"), HasSubstr("from stage 1"),
                             HasSubstr("to stage 1")));
  expect_same_state(state_of(*pipe), before, "after the stall before a barrier");
}

// With stage_rng, each stage's random streams are part of what a failed step
// leaves as it was: the step after a failure draws the dropout masks that a
// run which skipped the failed step draws.
TEST(InProcessFaults, AFailedStepLeavesEachStagesRandomStreamsAsTheyWere) {
  const auto make = [](const std::string& schedule) {
    torch::manual_seed(0);
    torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::Dropout(0.5), torch::nn::Tanh(),
                                torch::nn::Linear(16, 16), torch::nn::Dropout(0.5), torch::nn::Tanh(),
                                torch::nn::Linear(16, 3));
    model->to(torch::kFloat64);
    // No wait is meant to time out here: a timeout far above the step's time
    // even under a sanitizer (the stages' forwards take turns).
    return std::make_unique<StageRunner>(
        model, options_for(schedule).boundaries({2, 5}).stage_rng(true).timeout(std::chrono::seconds(30)));
  };
  for (const std::string schedule : {"1f1b", "pipedream"}) {
    for (uint32_t seed = 0; seed <= 3; ++seed) {
      auto pipe = make(schedule);
      std::mt19937 rng(seed);
      FaultPlan plan = draw_fault(FaultKind::kThrow, pipe->schedule(), rng, kStall);
      if (seed == 0) {  // the step's last action: every forward has drawn its masks
        plan.stage = kStages - 1;
        plan.action = static_cast<int>(pipe->schedule().workers[plan.stage].size()) - 1;
      }
      const std::string where = schedule + " seed " + std::to_string(seed);
      train(*pipe, 0);
      std::vector<at::Tensor> streams;
      for (int k = 0; k < kStages; ++k) streams.push_back(pipe->stage(k).random()->state().cpu.clone());
      PlannedFaults faults;
      {
        FaultInjectionScope scope(faults);
        faults.arm(plan);
        error_of<PipelineError>([&] { train(*pipe, 1); });
        faults.disarm();
      }
      ASSERT_TRUE(faults.fired()) << where;
      for (int k = 0; k < kStages; ++k) {
        EXPECT_TRUE(torch::equal(pipe->stage(k).random()->state().cpu, streams[k])) << where << ": stage " << k;
      }
      train(*pipe, 2);
      auto reference = make(schedule);
      for (int step : {0, 2}) train(*reference, step);
      expect_same_state(state_of(*pipe), state_of(*reference), where + ", the step after");
    }
  }
}

}  // namespace
}  // namespace conveyor::testing
