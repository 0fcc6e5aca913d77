// Sharding as actions of the schedule (schedules/sharding.h): PyTorch's
// UNSHARD / RESHARD / REDUCE_GRAD read and print as ours, place_sharding puts
// them by its rules on every synchronous schedule, validate() refuses what
// breaks the rules, and simulate() prices them on a link beside the compute.
#include "error_of.h"
#include "schedules/generators.h"
#include "schedules/sharding.h"
#include "schedules/simulate.h"
#include "schedules/validate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace conveyor::schedules {
namespace {

using ::testing::HasSubstr;
using testing::error_of;

TEST(ShardingActions, PyTorchsNamesReadAndPrintAsOurs) {
  // torch.distributed.pipelining's CSV, one row a rank.
  const Schedule s = Schedule::parse(
      "0UNSHARD,0F0,0F1,0B0,0B1,0RESHARD,0REDUCE_GRAD\n"
      "1UNSHARD,1F0,1B0,1F1,1B1,1RESHARD,1REDUCE_GRAD\n");
  EXPECT_EQ(s.num_stages, 2);
  EXPECT_EQ(s.num_microbatches, 2);
  ASSERT_TRUE(s.has_sharding());
  EXPECT_EQ(s.workers[0].size(), 4u);  // the compute actions alone
  EXPECT_EQ(s.sharding[0][0].position, 0u);
  EXPECT_EQ(s.sharding[0][1], (Schedule::PlacedShard{4, ShardAction{0, ShardKind::kReshard}}));
  EXPECT_EQ(s.str(),
            "# schedule custom stages=2 microbatches=2\n"
            "0UNSHARD 0F0 0F1 0B0 0B1 0RESHARD 0REDUCE_GRAD\n"
            "1UNSHARD 1F0 1B0 1F1 1B1 1RESHARD 1REDUCE_GRAD\n");
  EXPECT_EQ(Schedule::parse(s.str()), s);
  EXPECT_NO_THROW(validate(s));
  // A misspelt name is refused by name.
  EXPECT_THAT(error_of([] { Schedule::parse("0UNSHARDED 0F0 0B0\n"); }),
              HasSubstr("'0UNSHARDED' is not an action"));
}

TEST(ShardingActions, ParametersGatherBeforeTheFirstForwardAndGradientsReduceAfterTheLastBackward) {
  const Schedule s = place_sharding(make_1f1b(2, 3), {{.level = ShardLevel::kParameters}});
  EXPECT_EQ(s.str(),
            "# schedule 1f1b stages=2 microbatches=3\n"
            "0UNSHARD 0F0 0F1 0B0 0F2 0B1 0B2 0RESHARD 0REDUCE_GRAD\n"
            "1UNSHARD 1F0 1B0 1F1 1B1 1F2 1B2 1RESHARD 1REDUCE_GRAD\n");
  // Below kParameters the replicas hold whole parameters: only the reduction.
  const Schedule grads = place_sharding(make_1f1b(2, 3), {{.level = ShardLevel::kNone}, {.level = ShardLevel::kGradients}});
  EXPECT_EQ(grads.str(),
            "# schedule 1f1b stages=2 microbatches=3\n"
            "0F0 0F1 0B0 0F2 0B1 0B2 0REDUCE_GRAD\n"
            "1F0 1B0 1F1 1B1 1F2 1B2 1REDUCE_GRAD\n");
}

TEST(ShardingActions, SplitBackwardsReduceInTheirWSlots) {
  const Schedule s =
      place_sharding(make_zb_h1(3, 3), {{.level = ShardLevel::kGradients, .reduce_per_microbatch = true}});
  // Stage 1's line: a REDUCE_GRAD after each W, none after an I.
  EXPECT_EQ(s.str().substr(s.str().find('\n', s.str().find('\n') + 1) + 1),
            "1F0 1F1 1I0 1F2 1I1 1W0 1REDUCE_GRAD 1I2 1W1 1REDUCE_GRAD 1W2 1REDUCE_GRAD\n"
            "2F0 2I0 2F1 2I1 2F2 2I2 2W0 2REDUCE_GRAD 2W1 2REDUCE_GRAD 2W2 2REDUCE_GRAD\n");
  EXPECT_NO_THROW(validate(s));
}

// Per worker: the most stages whose parameters are gathered at once.
int most_gathered(const Schedule& s, int w) {
  int now = 0, most = 0;
  for (const Schedule::PlacedShard& p : s.sharding[w]) {
    if (p.action.kind == ShardKind::kUnshard) most = std::max(most, ++now);
    if (p.action.kind == ShardKind::kReshard) --now;
  }
  return most;
}

TEST(ShardingActions, AWorkerOfTwoStagesGathersEachOnceOrOneAtATime) {
  const Schedule v = make_schedule("zb-v", 2, 4);
  ASSERT_TRUE(v.has_virtual_stages());
  const Schedule once = place_sharding(v, {{.level = ShardLevel::kParameters}});
  const Schedule tight = place_sharding(v, {{.level = ShardLevel::kParameters, .regather = true}});
  for (int w = 0; w < v.num_workers(); ++w) {
    int unshards = 0;
    for (const Schedule::PlacedShard& p : once.sharding[w]) unshards += p.action.kind == ShardKind::kUnshard;
    EXPECT_EQ(unshards, 2) << "worker " << w;  // its two stages, once each
    EXPECT_EQ(most_gathered(once, w), 2);
    EXPECT_EQ(most_gathered(tight, w), 1);  // freed before the other stage gathers
  }
  EXPECT_NO_THROW(validate(once));
  EXPECT_NO_THROW(validate(tight));
}

TEST(ShardingActions, EverySynchronousScheduleTakesEveryPlacement) {
  for (const std::string& name : schedule_names(true)) {
    const Schedule s = make_schedule(name, 3, 6);
    for (const ShardLevel level : {ShardLevel::kNone, ShardLevel::kGradients, ShardLevel::kParameters}) {
      for (const bool each : {false, true}) {
        const Schedule placed = place_sharding(s, {{.level = level, .reduce_per_microbatch = each, .regather = each}});
        EXPECT_NO_THROW(validate(placed)) << name << " " << shard_level_name(level) << " " << each;
        EXPECT_EQ(Schedule::parse(placed.str()), placed) << name;
        // The compute is the schedule's own.
        EXPECT_EQ(placed.workers, s.workers) << name;
      }
    }
  }
  EXPECT_THAT(error_of([] { place_sharding(make_schedule("pipedream", 2, 2), {{}}); }),
              HasSubstr("only a synchronous schedule (step=batch) shards"));
  EXPECT_THAT(error_of([] { place_sharding(make_1f1b(3, 2), {{}, {}}); }), HasSubstr("2 stage settings for 3 stages"));
  EXPECT_THAT(error_of([] { place_sharding(Schedule::parse("0F0 0B0 0B0\n"), {{}}); }), HasSubstr("is repeated"));
  // Inference makes no gradients: nothing to place, and the schedule stays equal to itself.
  const Schedule forward = make_forward_only(2, 3);
  EXPECT_EQ(place_sharding(forward, {{.level = ShardLevel::kGradients}}), forward);
}

TEST(ShardingActions, TheValidatorRefusesWhatBreaksTheRulesByName) {
  const auto refusal = [](const char* text) { return error_of([&] { validate(Schedule::parse(text)); }); };
  EXPECT_THAT(refusal("0UNSHARD 0F0 0RESHARD 0B0\n"),
              HasSubstr("action 0B0 (worker 0, position 1) runs while stage 0's parameters are sharded: an UNSHARD "
                        "must come before it"));
  EXPECT_THAT(refusal("0UNSHARD 0F0 0UNSHARD 0B0 0RESHARD\n"),
              HasSubstr("sharding action 0UNSHARD (worker 0, before position 1): stage 0's parameters are gathered "
                        "already"));
  EXPECT_THAT(refusal("0UNSHARD 0F0 0B0 0RESHARD 0RESHARD\n"), HasSubstr("stage 0's parameters are not gathered"));
  EXPECT_THAT(refusal("0UNSHARD 0F0 0B0\n"),
              HasSubstr("stage 0 ends the step with its parameters gathered: a RESHARD must follow"));
  EXPECT_THAT(refusal("0F0 0F1 0B0 0REDUCE_GRAD 0B1\n"),
              HasSubstr("stage 0's gradient from 0B1 is never reduced: a REDUCE_GRAD must follow it"));
  EXPECT_THAT(refusal("0REDUCE_GRAD 0F0 0B0 0REDUCE_GRAD\n"), HasSubstr("has made no gradient since the step began"));
  EXPECT_THAT(refusal("0F0 0B0 0REDUCE_GRAD 0REDUCE_GRAD\n"), HasSubstr("no gradient since its last REDUCE_GRAD"));
  EXPECT_THAT(refusal("0F0 0B0 1REDUCE_GRAD\n1F0 1B0\n"),
              HasSubstr("is listed for worker 0, but stage 1 runs on worker 1"));
  EXPECT_THAT(refusal("# schedule ddg stages=1 microbatches=1 step=microbatch\n0F0 0B0 0REDUCE_GRAD\n"),
              HasSubstr("only a synchronous schedule (step=batch) may"));
  EXPECT_THAT(refusal("0F0 | 0B0 0REDUCE_GRAD |\n"), HasSubstr("sharding actions and lock-step barriers"));
  EXPECT_THAT(refusal("0F0 0B0 0REDUCE_GRAD\n"), HasSubstr("(no exception thrown)"));
  // A W carries the split backward's weight gradient: reducing after its I alone leaves it unreduced.
  EXPECT_THAT(refusal("0F0 0I0 0REDUCE_GRAD 0W0\n"), HasSubstr("has made no gradient since the step began"));
}

TEST(ShardingActions, TheSimulatorRunsThemOnALinkBesideTheCompute) {
  StageCosts costs = StageCosts::uniform(1, 1.0, 2.0);
  costs.unshard = {0.5};
  costs.reduce_grad = {0.25};
  // Gathered before the first forward (nothing to hide it behind), reduced after the last backward.
  const auto once = simulate(Schedule::parse("0UNSHARD 0F0 0F1 0B0 0B1 0RESHARD 0REDUCE_GRAD\n"), costs);
  EXPECT_DOUBLE_EQ(once.timeline[0][0].start, 0.5);
  EXPECT_DOUBLE_EQ(once.makespan, 0.5 + 6 + 0.25);
  ASSERT_EQ(once.sharding[0].size(), 3u);
  EXPECT_DOUBLE_EQ(once.sharding[0][2].start, 6.5);
  // Reduced per micro-batch, the first reduction hides behind the second backward.
  const Schedule each = Schedule::parse("0UNSHARD 0F0 0F1 0B0 0REDUCE_GRAD 0B1 0REDUCE_GRAD 0RESHARD\n");
  EXPECT_DOUBLE_EQ(simulate(each, costs).makespan, 0.5 + 6 + 0.25);
  costs.reduce_grad = {3.0};  // a slow link: the reductions queue on it
  EXPECT_DOUBLE_EQ(simulate(each, costs).makespan, 4.5 + 3 + 3);
  // Two stages on one worker: the second's gather is prefetched behind the first's forward.
  StageCosts two = StageCosts::uniform(2, 1.0, 2.0);
  two.unshard = {0.5, 0.5};
  const Schedule v = Schedule::parse("0UNSHARD 0F0 1UNSHARD 1F0 1B0 1RESHARD 0B0 0RESHARD\n");
  ASSERT_NO_THROW(validate(v));
  EXPECT_DOUBLE_EQ(simulate(v, two).makespan, 0.5 + 6);
  // Gathering one at a time, the second waits for the first to be freed.
  const Schedule tight = Schedule::parse("0UNSHARD 0F0 0RESHARD 1UNSHARD 1F0 1B0 1RESHARD 0UNSHARD 0B0 0RESHARD\n");
  ASSERT_NO_THROW(validate(tight));
  EXPECT_DOUBLE_EQ(simulate(tight, two).makespan, 0.5 + 1 + 0.5 + 3 + 0.5 + 2);
}

}  // namespace
}  // namespace conveyor::schedules
