// Schedules beyond the seeds: virtual stages (several chunks per worker),
// interleaved 1F1B, zero-bubble schedules with split backwards (I and W),
// recomputation and offloading declarations, and torch.distributed.pipelining's
// CSV action format.
#include "error_of.h"
#include "schedules/generators.h"
#include "schedules/simulate.h"
#include "schedules/stash_memory.h"
#include "schedules/validate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace conveyor::schedules {
namespace {

using ::testing::HasSubstr;
using testing::error_of;

TEST(VirtualStages, InterleavedPlacesStagesInALoop) {
  const Schedule s = make_interleaved_1f1b(2, 2, 4);
  EXPECT_EQ(s.num_stages, 4);
  EXPECT_EQ(s.num_workers(), 2);
  EXPECT_TRUE(s.has_virtual_stages());
  EXPECT_EQ(s.placement, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(s.str(),
            "# schedule interleaved stages=4 microbatches=4\n"
            "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3\n"
            "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3\n");
  // The placement is read off the lines.
  const Schedule parsed = Schedule::parse(s.str());
  EXPECT_EQ(parsed, s);
  EXPECT_EQ(stage_actions(s, 2).front().str(), "2F0");
  EXPECT_EQ(stage_actions(s, 2).size(), 8u);
  // A V shape (stage 0 and 3 on worker 0) is just another placement.
  const Schedule v = Schedule::parse("0F0 1F0 2F0 3F0 3B0 2B0 1B0 0B0\n");
  EXPECT_EQ(v.num_stages, 4);
  EXPECT_EQ(v.num_workers(), 1);
  EXPECT_NO_THROW(validate(v));
  const Schedule vee = Schedule::parse("0F0 3F0 3B0 0B0\n1F0 2F0 2B0 1B0\n");
  EXPECT_EQ(vee.placement, (std::vector<int>{0, 1, 1, 0}));
  EXPECT_NO_THROW(validate(vee));
}

TEST(VirtualStages, ZbH1SplitsEveryBackward) {
  const Schedule s = make_zb_h1(3, 3);
  EXPECT_TRUE(s.splits_backward());
  EXPECT_FALSE(s.has_virtual_stages());
  EXPECT_EQ(s.str(),
            "# schedule zb-h1 stages=3 microbatches=3\n"
            "0F0 0F1 0F2 0I0 0W0 0I1 0W1 0I2 0W2\n"
            "1F0 1F1 1I0 1F2 1I1 1W0 1I2 1W1 1W2\n"
            "2F0 2I0 2F1 2I1 2F2 2I2 2W0 2W1 2W2\n");
  EXPECT_EQ(Schedule::parse(s.str()), s);
  EXPECT_EQ(Action::parse("3W12"), (Action{3, ActionKind::kWeight, 12}));
  EXPECT_EQ(Action::parse("0I1"), (Action{0, ActionKind::kBackwardInput, 1}));
}

TEST(VirtualStages, GeneratorsRefuseWhatTheyCannotRun) {
  EXPECT_THAT(error_of([] { make_schedule("interleaved", 2, 3); }),
              HasSubstr("3 micro-batches do not fill rounds of 2 (use a multiple of 2)"));
  EXPECT_THAT(error_of([] { make_interleaved_1f1b(2, 1, 4); }), HasSubstr("with 1 it is 1f1b"));
  EXPECT_THAT(error_of([] { make_schedule("1f1b", 2, 4, false, 2); }),
              HasSubstr("schedule '1f1b' runs one stage per worker, not 2 chunks"));
  EXPECT_EQ(make_schedule("interleaved", 2, 4).num_stages, 4);  // two chunks by default
  EXPECT_EQ(make_schedule("zb-interleaved", 2, 4, false, 3).num_stages, 6);
}

// The validator names each problem of split backwards and placements.
TEST(VirtualStages, ValidatorNamesEachProblem) {
  const auto invalid = [](const std::string& text) { return error_of([&] { validate(Schedule::parse(text)); }); };
  EXPECT_THAT(invalid("0F0 0W0 0I0\n"), HasSubstr("action 0W0 (stage 0, position 1, weight backward of micro-batch 0)"
                                                  ": weight backward before its input backward 0I0"));
  EXPECT_THAT(invalid("0I0 0F0 0W0\n"), HasSubstr("0I0 (stage 0, position 0, input backward of micro-batch 0): "
                                                  "backward before its forward 0F0"));
  EXPECT_THAT(invalid("0F0 0B0 0W0\n"), HasSubstr("was whole (B), so no weight gradient is left for a W"));
  EXPECT_THAT(invalid("0F0 0I0\n"), HasSubstr("stage 0 never runs the weight backward of micro-batch 0 (no action 0W0 "
                                              "after its 0I0)"));
  EXPECT_THAT(invalid("0F0 0I0 0B0 0W0\n"), HasSubstr("is repeated (micro-batch 0's backward already ran on stage 0)"));
  // A chunk placed on no worker, and one placed on two.
  EXPECT_THAT(invalid("# schedule x stages=3 microbatches=1\n0F0 2F0 2B0 0B0\n"),
              HasSubstr("stage 1 is placed on no worker (no line runs its actions)"));
  EXPECT_THAT(invalid("0F0 2F0 2B0 0B0\n1F0 1B0 2F1\n"),
              HasSubstr("is listed for worker 1, but stage 2 runs on worker 0 (a stage runs on one worker)"));
  // An interleaved order that waits on itself: worker 0 runs stage 2's
  // backward before stage 3 (worker 1) can have sent its gradient, because
  // worker 1 waits for stage 2's forward, which worker 0 never reaches.
  EXPECT_THAT(invalid("0F0 2B0 2F0 0B0\n1F0 3F0 3B0 1B0\n"),
              HasSubstr("2B0 (stage 2, position 1, backward of micro-batch 0): backward before its forward 2F0"));
  const std::string deadlock = invalid("0F0 0F1 2F0 2B0 2F1 2B1 0B0 0B1\n1F0 1F1 3F1 3F0 3B0 3B1 1B0 1B1\n");
  EXPECT_THAT(deadlock, HasSubstr("deadlocks under blocking transfers"));
  EXPECT_THAT(deadlock, HasSubstr("worker 1 blocks at 3F1 waiting for the activation of micro-batch 1 from stage 2"));
  // Asynchronous methods keep one stage per worker and whole backwards.
  EXPECT_THAT(invalid("# schedule x stages=2 microbatches=1 step=microbatch\n0F0 1F0 1B0 0B0\n"),
              HasSubstr("only a synchronous schedule may"));
  EXPECT_THAT(invalid("# schedule x stages=1 microbatches=1 step=microbatch\n0F0 0I0 0W0\n"),
              HasSubstr("splits backwards into I and W, which only a synchronous schedule may"));
}

// For equal costs the bubble of interleaved 1F1B is (K-1)/v micro-batch
// times, ZB-H1's (K-1)(F+I-W) with F = I = W: the closed forms.
TEST(VirtualStages, SimulatedBubblesMatchTheClosedForms) {
  for (int k = 2; k <= 4; ++k) {
    for (int v = 2; v <= 3; ++v) {
      for (int m = k; m <= 4 * k; m += k) {
        // One micro-batch takes 3 time units through the model: F = 1, B = 2.
        const auto costs = StageCosts::uniform(k * v, 1.0 / v, 2.0 / v);
        const Simulation il = simulate(make_interleaved_1f1b(k, v, m), costs);
        EXPECT_NEAR(il.makespan, 3.0 * m + 3.0 * (k - 1) / v, 1e-9) << "K=" << k << " v=" << v << " M=" << m;
        const double bubble = 3.0 * (k - 1) / v / (3.0 * m + 3.0 * (k - 1) / v);
        EXPECT_NEAR(il.bubble_fraction, bubble, 1e-9);
        const Simulation zb = simulate(make_interleaved_zb(k, v, m), costs);
        EXPECT_NEAR(zb.makespan, 3.0 * m + 1.0 * (k - 1) / v, 1e-9) << "K=" << k << " v=" << v << " M=" << m;
      }
    }
    for (int m = k; m <= 12; ++m) {
      const Simulation zb = simulate(make_zb_h1(k, m), StageCosts::uniform(k, 1, 2));  // W = half of B
      EXPECT_NEAR(zb.makespan, 3.0 * m + (k - 1), 1e-9) << "K=" << k << " M=" << m;
      const Simulation one = simulate(make_1f1b(k, m), StageCosts::uniform(k, 1, 2));
      EXPECT_NEAR(one.makespan, 3.0 * m + 3.0 * (k - 1), 1e-9);
    }
  }
  // A W costs what StageCosts::weight says; I the rest of the backward.
  StageCosts costs = StageCosts::uniform(1, 1, 3);
  costs.weight = {2};
  const Simulation one = simulate(Schedule::parse("0F0 0I0 0W0\n"), costs);
  EXPECT_DOUBLE_EQ(one.timeline[0][1].end - one.timeline[0][1].start, 1.0);
  EXPECT_DOUBLE_EQ(one.timeline[0][2].end - one.timeline[0][2].start, 2.0);
  EXPECT_DOUBLE_EQ(one.makespan, 4.0);
  // A split that costs more than the whole backward: I as StageCosts::input says.
  costs.input = {2.5};
  const Simulation dearer = simulate(Schedule::parse("0F0 0I0 0W0\n"), costs);
  EXPECT_DOUBLE_EQ(dearer.timeline[0][1].end - dearer.timeline[0][1].start, 2.5);
  EXPECT_DOUBLE_EQ(dearer.makespan, 5.5);
  EXPECT_DOUBLE_EQ(simulate(Schedule::parse("0F0 0B0\n"), costs).makespan, 4.0);  // a whole B is unchanged
}

// A split backward keeps its micro-batch until the W; recomputation stashes
// only inputs, which the stash sizes say, and the simulator replays forwards.
TEST(VirtualStages, StashesFollowTheSplitBackward) {
  const Schedule zb = make_zb_h1(3, 6);
  const Simulation sim = simulate(zb, StageCosts::uniform(3, 1, 2));
  EXPECT_EQ(sim.peak_inflight, (std::vector<int>{3, 3, 3}));  // each stage holds K until the W
  const std::vector<std::vector<int64_t>> ones(3, std::vector<int64_t>(6, 1));
  EXPECT_EQ(peak_stash_bytes(zb, ones), (std::vector<int64_t>{3, 3, 3}));
  const Simulation il = simulate(make_interleaved_1f1b(2, 2, 4), StageCosts::uniform(4, 1, 2));
  EXPECT_EQ(il.peak_inflight, (std::vector<int>{4, 3, 2, 1}));
  Schedule recompute = make_1f1b(2, 4);
  recompute.stash = Stash::kInputs;
  const Simulation r = simulate(recompute, StageCosts::uniform(2, 1, 2));
  EXPECT_NEAR(r.makespan, 4 * 4.0 + 4.0, 1e-9);  // every backward replays its forward first
  Schedule offload = make_zb_h1(2, 2);
  offload.stash = Stash::kOffload;
  EXPECT_THAT(offload.str(), HasSubstr("stash=offload"));
  EXPECT_EQ(Schedule::parse(offload.str()), offload);
}

// torch.distributed.pipelining writes a schedule as CSV, one row per rank,
// actions F / I / W / B, empty cells for idle steps: it parses as is.
TEST(VirtualStages, ReadsTorchPipeliningCsv) {
  const std::string csv =
      "0F0,0F1,,2F0,2F1,2I0,2W0,2I1,2W1,0I0,0W0,0I1,0W1\n"
      "1F0,1F1,3F0,3I0,3W0,3F1,3I1,3W1,1I0,1W0,1I1,1W1\n";
  const Schedule s = Schedule::parse(csv);
  EXPECT_EQ(s.num_stages, 4);
  EXPECT_EQ(s.num_microbatches, 2);
  EXPECT_EQ(s.placement, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_NO_THROW(validate(s));
  EXPECT_THAT(error_of([] { Schedule::parse("0F0,0SEND_F0\n"); }),
              HasSubstr("'0SEND_F0' is not an action (unknown kind"));
}

}  // namespace
// Eager 1F1B: (1 + lookahead)(K-1-k) warm-up forwards on stage k. With a
// link as slow as a micro-batch's compute (2 L = F + B), 1F1B waits a round
// trip per micro-batch; one forward ahead hides it, as GPipe's streaming
// forwards do, for (K-1-k) more stashed micro-batches than 1F1B.
TEST(EagerOneFOneB, RunsForwardsAheadAndHidesTheLinksLatency) {
  EXPECT_EQ(make_eager_1f1b(3, 6, 1).str(),
            "# schedule eager-1f1b stages=3 microbatches=6\n"
            "0F0 0F1 0F2 0F3 0F4 0B0 0F5 0B1 0B2 0B3 0B4 0B5\n"
            "1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1B4 1B5\n"
            "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3 2F4 2B4 2F5 2B5\n");
  EXPECT_EQ(make_schedule("Eager-1F1B", 2, 5), make_eager_1f1b(2, 5, 1));
  EXPECT_EQ(make_schedule("eager-1f1b", 2, 5, false, 0, 3), make_eager_1f1b(2, 5, 3));
  for (int k = 1; k <= 5; ++k) {
    for (int m = 1; m <= 12; ++m) {
      for (int ahead = 1; ahead <= 3; ++ahead) {
        const Schedule s = make_eager_1f1b(k, m, ahead);
        const std::string what = "K=" + std::to_string(k) + " M=" + std::to_string(m) + " +" + std::to_string(ahead);
        EXPECT_NO_THROW(validate(s, {2, true})) << what;
        const Simulation sim = simulate(s, StageCosts::uniform(k, 1, 2));
        for (int st = 0; st < k; ++st) {
          EXPECT_EQ(sim.peak_inflight[st], std::min(m, (1 + ahead) * (k - 1 - st) + 1)) << what << " stage " << st;
        }
        // No link cost: exactly 1F1B's step.
        EXPECT_DOUBLE_EQ(sim.makespan, simulate(make_1f1b(k, m), StageCosts::uniform(k, 1, 2)).makespan) << what;
      }
    }
  }
  for (int k = 2; k <= 4; ++k) {
    for (int m : {8, 16, 32}) {
      for (double latency : {0.5, 1.5, 3.0}) {
        const StageCosts costs = StageCosts::uniform(k, 1, 2, latency);
        const double one = simulate(make_1f1b(k, m), costs).makespan;
        const double gpipe = simulate(make_gpipe(k, m), costs).makespan;
        EXPECT_GT(one, gpipe) << "K=" << k << " M=" << m;  // 1F1B waits for round trips
        for (int ahead = 1; ahead <= 2; ++ahead) {
          const double eager = simulate(make_eager_1f1b(k, m, ahead), costs).makespan;
          const std::string what = "K=" + std::to_string(k) + " M=" + std::to_string(m) + " +" +
                                   std::to_string(ahead) + " L=" + std::to_string(latency);
          if (2 * latency <= ahead * 3.0) {
            EXPECT_DOUBLE_EQ(eager, gpipe) << what;  // the latency is hidden
          } else {
            EXPECT_LT(eager, one) << what;
            EXPECT_GT(eager, gpipe) << what;
          }
        }
      }
    }
  }
  // Forwards ahead fill shallow channels both ways: lookahead a runs on
  // channels of a + 1 messages (what the runtime gives it).
  EXPECT_THAT(error_of([] { validate(make_eager_1f1b(2, 4, 2), {1, true}); }), HasSubstr("deadlocks"));
  EXPECT_THAT(error_of([] { validate(make_eager_1f1b(2, 8, 4), {2, true}); }), HasSubstr("deadlocks"));
  for (int k = 2; k <= 5; ++k) {
    for (int ahead = 1; ahead <= 8; ++ahead) {
      EXPECT_NO_THROW(validate(make_eager_1f1b(k, 24, ahead), {ahead + 1, true}));
    }
  }
  EXPECT_THAT(error_of([] { make_eager_1f1b(2, 4, 0); }), HasSubstr("(with 0 it is 1f1b)"));
  EXPECT_THAT(error_of([] { make_schedule("1f1b", 2, 4, false, 0, 2); }),
              HasSubstr("only eager-1f1b runs forwards ahead (lookahead 2 asked of '1f1b')"));
  EXPECT_THAT(error_of([] { make_schedule("eager-1f1b", 2, 4, false, 2); }), HasSubstr("not 2 chunks"));
}

// Workers sharing fewer cores than they are wait for one: on one core a
// pipeline is its work end to end; with as many cores as workers, nothing
// changes; in between, in between.
TEST(SharedCores, ActionsWaitForAFreeCore) {
  for (const char* name : {"gpipe", "1f1b", "eager-1f1b", "zb-h1"}) {
    for (int k = 2; k <= 4; ++k) {
      for (int m : {1, 4, 8}) {
        const Schedule s = make_schedule(name, k, m);
        StageCosts costs = StageCosts::uniform(k, 1, 2);
        const double free = simulate(s, costs).makespan;
        costs.cores = k;
        EXPECT_DOUBLE_EQ(simulate(s, costs).makespan, free) << name << " K=" << k << " M=" << m;
        costs.cores = 1;
        const Simulation one = simulate(s, costs);
        EXPECT_DOUBLE_EQ(one.makespan, 3.0 * k * m) << name << " K=" << k << " M=" << m;  // all the work, in turn
        EXPECT_NEAR(one.bubble_fraction, 1.0 - 1.0 / k, 1e-12);
        if (k > 2) {
          costs.cores = 2;
          const double two = simulate(s, costs).makespan;
          EXPECT_LE(two, one.makespan) << name << " K=" << k << " M=" << m;
          EXPECT_GE(two, std::max(free, 3.0 * k * m / 2) - 1e-9) << name << " K=" << k << " M=" << m;
        }
      }
    }
  }
  // Never two actions on one core at once.
  StageCosts costs = StageCosts::uniform(4, 1, 2);
  costs.cores = 2;
  const Simulation sim = simulate(make_1f1b(4, 8), costs);
  std::vector<std::pair<double, int>> events;
  for (const auto& line : sim.timeline) {
    for (const auto& t : line) events.push_back({t.start, 1}), events.push_back({t.end, -1});
  }
  std::sort(events.begin(), events.end());  // an end before a start at the same time
  int running = 0;
  for (const auto& [at, delta] : events) EXPECT_LE(running += delta, 2) << "at " << at;
}

// Workers sharing a CPU as measured: while n actions run, each goes
// 1 / slowdown[n - 1] as fast. Twice as slow for two at once is one core's
// work end to end; no slowdown is no sharing; in between, every action at
// most that much slower, so the step too.
TEST(SharedCores, ActionsRunSlowerWhileOthersRun) {
  for (const char* name : {"gpipe", "1f1b", "eager-1f1b", "zb-h1", "interleaved"}) {
    for (int k = 2; k <= 4; ++k) {
      for (int m : {1, 4, 8}) {
        if (std::string(name) == "interleaved" && m % k != 0) continue;  // whole rounds of K
        const Schedule s = make_schedule(name, k, m);
        const std::string where = std::string(name) + " K=" + std::to_string(k) + " M=" + std::to_string(m);
        StageCosts costs = StageCosts::uniform(s.num_stages, 1, 2);
        const Simulation free = simulate(s, costs);
        double work = 0;
        for (double b : free.busy) work += b;
        costs.slowdown = {1.0};  // one core, time-sliced
        EXPECT_NEAR(simulate(s, costs).makespan, work, 1e-9) << where;
        costs.slowdown.assign(k, 1.0);
        EXPECT_NEAR(simulate(s, costs).makespan, free.makespan, 1e-9) << where;
        costs.slowdown.assign(k, 1.25);  // at most 1.25 x slower, however many run
        costs.slowdown[0] = 1.0;
        const Simulation shared = simulate(s, costs);
        EXPECT_GE(shared.makespan, free.makespan - 1e-9) << where;
        EXPECT_LE(shared.makespan, 1.25 * free.makespan + 1e-9) << where;
        // Two cores, each of two 1.25 x slower: past two, n at once share them.
        costs.slowdown = {1.0, 1.25};
        EXPECT_GE(simulate(s, costs).makespan, work / 1.6 - 1e-9) << where;
        // Each action takes its cost alone, longer while others run.
        for (const auto& line : shared.timeline) {
          for (const auto& t : line) EXPECT_GE(t.end - t.start, 1.0 - 1e-9) << where << " " << t.action.str();
        }
      }
    }
  }
  // The factor applies only while both run: F0 on stage 0 runs alone, then
  // F1 on stage 0 and F0 on stage 1 run together, each at 2/3 of its speed.
  StageCosts costs = StageCosts::uniform(2, 1, 2);
  costs.slowdown = {1.0, 1.5};
  const Simulation sim = simulate(make_gpipe(2, 2), costs);
  // F0 [0, 1) alone; F1 on stage 0 and F0 on stage 1 from 1, each at 2/3: both end at 2.5.
  ASSERT_GE(sim.timeline[0].size(), 2u);
  EXPECT_NEAR(sim.timeline[0][1].end, 2.5, 1e-12);
  EXPECT_NEAR(sim.timeline[1][0].end, 2.5, 1e-12);
}

}  // namespace conveyor::schedules
