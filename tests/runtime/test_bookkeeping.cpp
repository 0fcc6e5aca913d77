// The runtime's bookkeeping classes on their own: the activation stash, weight
// versions, the stage workers, step rollback, and the in-process mailbox.
// The end-to-end tests (test_pipeline, test_schedules_runtime, test_faults)
// run them inside steps; these pin down each one's contract directly.
#include "plugin/core/errors.h"
#include "plugin/model/stage.h"
#include "plugin/runtime/activation_stash.h"
#include "plugin/runtime/step_rollback.h"
#include "plugin/runtime/weight_versions.h"
#include "plugin/runtime/workers.h"
#include "plugin/support/fault_injection.h"
#include "plugin/transport/mailbox.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

namespace conveyor {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<Stage> linear_stage(int64_t in = 3, int64_t out = 2) {
  torch::manual_seed(0);
  std::vector<std::pair<std::string, torch::nn::AnyModule>> layers;
  layers.emplace_back("0", torch::nn::AnyModule(torch::nn::Linear(in, out)));
  return std::make_shared<Stage>(0, std::move(layers), 0, c10::Device(c10::kCPU));
}

StashEntry entry_of(int64_t bytes, bool inputs_only) {
  StashEntry e;
  e.bytes = bytes;
  e.inputs_only = inputs_only;
  return e;
}

// --- ActivationStash -----------------------------------------------------------

TEST(ActivationStash, CountsPeaksOfEntriesAndBytes) {
  ActivationStash stash;
  stash.put(0, entry_of(100, false));
  stash.put(1, entry_of(50, true));
  stash.put(2, entry_of(10, false));
  EXPECT_EQ(stash.take(1).bytes, 50);
  stash.put(3, entry_of(5, true));
  EXPECT_EQ(stash.peak_inflight(), 3);
  EXPECT_EQ(stash.peak_activations(), 2);
  EXPECT_EQ(stash.peak_inputs(), 1);
  EXPECT_EQ(stash.peak_bytes(), 160);
  // Left in place by at() and find(); gone after take().
  EXPECT_EQ(stash.at(3).bytes, 5);
  EXPECT_NE(stash.find(3), nullptr);
  stash.take(3);
  EXPECT_EQ(stash.find(3), nullptr);
}

TEST(ActivationStash, NamesTheMicroBatchNoForwardStashed) {
  ActivationStash stash;
  stash.put(0, entry_of(1, false));
  try {
    stash.take(7);
    FAIL() << "take of an absent micro-batch returned";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("7"));
  }
  EXPECT_THROW(stash.at(4), std::exception);
}

// --- WeightVersions --------------------------------------------------------------

TEST(WeightVersions, HandsEachForwardTheVersionItReadsAndDropsItAfterTheLastReader) {
  auto stage = linear_stage();
  const at::Tensor w = stage->live()[0];
  const at::Tensor w0 = w.detach().clone();
  WeightVersions versions;
  // Forwards of micro-batches 0 and 1 read version 0, micro-batch 2 version 1.
  versions.begin({0, 0, 1}, *stage);
  EXPECT_EQ(versions.held(), 1);
  const auto v0 = versions.for_forward(0, 0);
  {
    torch::NoGradGuard no_grad;
    w.add_(1.0);  // the stage's first update
  }
  versions.after_update(1, *stage);  // version 1: a forward still reads it
  versions.note_peak();
  EXPECT_EQ(versions.held(), 2);
  const auto v0_again = versions.for_forward(1, 1);
  EXPECT_EQ(v0_again, v0);  // one copy for both readers
  EXPECT_TRUE(torch::equal(v0->tensors[0], w0));
  const auto v1 = versions.for_forward(2, 1);
  EXPECT_TRUE(torch::equal(v1->tensors[0], w0 + 1.0));
  versions.after_update(2, *stage);  // no forward reads version 2: nothing copied
  EXPECT_EQ(versions.peak(), 2);
}

TEST(WeightVersions, RefusesAVersionThatWasNeverMade) {
  auto stage = linear_stage();
  WeightVersions versions;
  versions.begin({1}, *stage);  // read after one update, which never comes
  try {
    versions.for_forward(0, 0);
    FAIL() << "a missing version was handed out";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("weight version 1 is not available (this stage has made 0 updates)"));
  }
}

// --- WorkerThreads ------------------------------------------------------------------

TEST(WorkerThreads, RunsEveryIndexOnItsOwnThreadAndReportsErrorsByIndex) {
  WorkerThreads workers(3);
  std::vector<std::thread::id> ids(3);
  std::atomic<int> calls{0};
  for (int round = 0; round < 2; ++round) {
    const auto errors = workers.run([&](int k) {
      ++calls;
      if (round == 0) ids[k] = std::this_thread::get_id();
      if (round == 1) {
        EXPECT_EQ(ids[k], std::this_thread::get_id());  // threads live across runs
      }
      if (round == 1 && k == 2) throw std::runtime_error("worker 2 failed");
    });
    ASSERT_EQ(errors.size(), 3u);
    EXPECT_FALSE(errors[0]);
    EXPECT_FALSE(errors[1]);
    EXPECT_EQ(static_cast<bool>(errors[2]), round == 1);
  }
  EXPECT_EQ(calls.load(), 6);
  EXPECT_NE(ids[0], ids[1]);
  EXPECT_NE(ids[1], ids[2]);
  EXPECT_NE(ids[0], std::this_thread::get_id());
}

TEST(WorkerThreads, CarryTheCallersGradMode) {
  WorkerThreads workers(2);
  std::vector<int> grad(2, -1);
  {
    torch::NoGradGuard no_grad;
    workers.run([&](int k) { grad[k] = c10::GradMode::is_enabled() ? 1 : 0; });
  }
  EXPECT_EQ(grad, (std::vector<int>{0, 0}));
}

// --- StepRollback --------------------------------------------------------------------

// Of every optimizer LibTorch ships with state (copied in memory) and one it
// cannot know (serialized): weights, state, learning rate and update count.
TEST(StepRollback, PutsBackWeightsOptimizerStateAndUpdateCount) {
  using namespace torch::optim;
  struct Tagged : SGD {  // a type of its own: its state is serialized
    using SGD::SGD;
  };
  const std::vector<std::pair<std::string, std::function<std::unique_ptr<Optimizer>(std::vector<at::Tensor>)>>> kinds =
      {{"SGD", [](auto p) { return std::make_unique<SGD>(p, SGDOptions(0.1).momentum(0.9)); }},
       {"Adam", [](auto p) { return std::make_unique<Adam>(p, AdamOptions(0.1).amsgrad(true)); }},
       {"AdamW", [](auto p) { return std::make_unique<AdamW>(p, AdamWOptions(0.1)); }},
       {"Adagrad", [](auto p) { return std::make_unique<Adagrad>(p, AdagradOptions(0.1)); }},
       {"RMSprop",
        [](auto p) { return std::make_unique<RMSprop>(p, RMSpropOptions(0.1).momentum(0.5).centered(true)); }},
       {"another", [](auto p) { return std::make_unique<Tagged>(p, SGDOptions(0.1).momentum(0.9)); }}};
  for (const auto& [name, make] : kinds) {
    SCOPED_TRACE(name);
    auto stage = linear_stage();
    stage->set_optimizer(make(stage->live()));
    const auto step = [&] {
      stage->module()->forward(torch::ones({4, 3})).sum().backward();
      stage->collect_gradients();
      stage->step(-1.0);
    };
    step();  // the state exists
    const at::Tensor w_before = stage->live()[0].detach().clone();
    StepRollback rollback;
    EXPECT_TRUE(torch::equal(rollback.keep(*stage)->tensors[0], w_before));  // what it keeps, it returns
    EXPECT_FALSE(rollback.empty());
    stage->step(0.01);  // another learning rate, as a schedule would set
    step();
    step();
    EXPECT_EQ(stage->updates(), 4);
    EXPECT_FALSE(torch::equal(stage->live()[0], w_before));
    rollback.restore();
    EXPECT_EQ(stage->updates(), 1);
    EXPECT_TRUE(torch::equal(stage->live()[0], w_before));
    EXPECT_EQ(stage->optimizer()->param_groups()[0].options().get_lr(), 0.1);
    // The restored state makes the next step what it was the first time,
    // after any number of restores.
    step();
    const at::Tensor once = stage->live()[0].detach().clone();
    for (int again = 0; again < 2; ++again) {
      rollback.restore();
      step();
      EXPECT_TRUE(torch::equal(stage->live()[0], once)) << again;
    }
  }
}

TEST(StepRollback, RandomStreamsAloneKeepNoWeights) {
  auto stage = linear_stage();
  stage->enable_random(7);
  StepRollback rollback;
  rollback.keep_random(*stage);
  EXPECT_TRUE(rollback.empty());
  at::Tensor first, second;
  stage->random()->run([&] { first = torch::rand({4}); });
  rollback.restore();
  stage->random()->run([&] { second = torch::rand({4}); });
  EXPECT_TRUE(torch::equal(first, second));  // the draw happened again
}

// --- Mailbox ----------------------------------------------------------------------------

using Box = Mailbox<int>;

Clock::time_point in_ms(int ms) { return Clock::now() + std::chrono::milliseconds(ms); }

TEST(Mailbox, DeliversByMicroBatchNotByArrival) {
  Box box(2);
  const auto what = [] { return std::string("waiting"); };
  box.put(1, 11, in_ms(1000), what);
  box.put(0, 10, in_ms(1000), what);
  EXPECT_EQ(box.take(0, in_ms(1000), what), 10);
  EXPECT_EQ(box.take(1, in_ms(1000), what), 11);
}

TEST(Mailbox, ASendIntoAFullChannelTimesOutWithItsDescription) {
  Box box(1);
  const auto what = [] { return std::string("stage 0 sending micro-batch 1"); };
  box.put(0, 1, in_ms(1000), what);
  try {
    box.put(1, 2, in_ms(30), what);
    FAIL() << "a send into a full channel returned";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("stage 0 sending micro-batch 1"));
  }
}

TEST(Mailbox, CapacityZeroIsARendezvous) {
  Box box(0);
  const auto what = [] { return std::string("rendezvous"); };
  std::atomic<bool> sent{false};
  std::thread sender([&] {
    box.put(0, 5, in_ms(5000), what);
    sent = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(sent.load());  // nobody took it yet
  EXPECT_EQ(box.take(0, in_ms(5000), what), 5);
  sender.join();
  EXPECT_TRUE(sent.load());
}

TEST(Mailbox, AbortWakesAWaiterAndResetClearsIt) {
  Box box(2);
  const auto what = [] { return std::string("waiting"); };
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    box.abort();
  });
  EXPECT_THROW(box.take(0, in_ms(5000), what), AbortedError);
  aborter.join();
  box.reset();
  box.put(3, 4, in_ms(1000), what);
  EXPECT_EQ(box.take(3, in_ms(1000), what), 4);
}

// --- FaultInjectionScope --------------------------------------------------------------

TEST(FaultInjectionScope, InstallsForItsLifetimeAndRefusesASecond) {
  FaultInjector first, second;
  EXPECT_EQ(fault_injector(), nullptr);
  {
    FaultInjectionScope scope(first);
    EXPECT_EQ(fault_injector(), &first);
    try {
      FaultInjectionScope again(second);
      FAIL() << "a second scope was installed over the first";
    } catch (const std::logic_error& e) {
      EXPECT_THAT(e.what(), HasSubstr("a fault injector is installed already"));
    }
    EXPECT_EQ(fault_injector(), &first);
  }
  EXPECT_EQ(fault_injector(), nullptr);
}

}  // namespace
}  // namespace conveyor
