// The asynchronous methods as schedules: their declarations, lock-step
// iterations, and the step time and storage the seed study's table gives.
#include "error_of.h"
#include "schedules/generators.h"
#include "schedules/simulate.h"
#include "schedules/validate.h"

#include <gtest/gtest.h>

#include <string>

namespace conveyor::schedules {
namespace {

using testing::error_of;

#define EXPECT_ERROR(stmt, text) \
  EXPECT_NE(error_of([&] { stmt; }).find(text), std::string::npos) << error_of([&] { stmt; })

TEST(AsyncSchedules, DeclareWhatTheRuntimeMustDo) {
  const Schedule pd = make_pipedream(3, 4), ddg = make_ddg(3, 4), fr = make_fr(3, 4);
  EXPECT_TRUE(pd.weight_stashing && pd.step_per_microbatch && pd.barriers.empty());
  EXPECT_TRUE(ddg.weight_stashing && ddg.step_per_microbatch && !ddg.barriers.empty());
  EXPECT_TRUE(fr.stash == Stash::kInputs && !fr.weight_stashing && fr.step_per_microbatch);
  // The same per-stage order as 1F1B: stage k runs its backward of t after d_k = K-1-k more forwards.
  EXPECT_EQ(pd.workers, make_1f1b(3, 4).workers);
  EXPECT_EQ(ddg.workers, make_1f1b(3, 4).workers);
  EXPECT_TRUE(make_gpipe(2, 2).synchronous());
  EXPECT_FALSE(pd.synchronous());
}

TEST(AsyncSchedules, TextFormCarriesDeclarationsAndBarriers) {
  EXPECT_EQ(make_ddg(2, 2).str(),
            "# schedule ddg stages=2 microbatches=2 weights=stashed step=microbatch\n"
            "0F0 | 0F1 0B0 | 0B1\n"
            "1F0 1B0 | 1F1 1B1 |\n");
  EXPECT_EQ(make_fr(2, 3).str(),
            "# schedule fr stages=2 microbatches=3 stash=inputs step=microbatch\n"
            "0F0 | 0F1 0B0 | 0F2 0B1 | 0B2\n"
            "1F0 1B0 | 1F1 1B1 | 1F2 1B2 |\n");
  EXPECT_EQ(make_pipedream(2, 2, true).str(),
            "# schedule pipedream stages=2 microbatches=2 weights=stashed step=microbatch sync=vertical\n"
            "0F0 0F1 0B0 0B1\n1F0 1B0 1F1 1B1\n");
  for (const Schedule& s : {make_ddg(4, 6), make_fr(3, 5), make_pipedream(4, 7, true)}) {
    EXPECT_EQ(Schedule::parse(s.str()), s) << s.str();
  }
  EXPECT_ERROR(Schedule::parse("# schedule x stash=everything\n0F0 0B0\n"),
               "expected stash=inputs or stash=activations");
}

TEST(AsyncSchedules, BadRequestsAreClear) {
  EXPECT_ERROR(make_schedule("pipedream", 4, 2), "pipedream with 2 micro-batches cannot fill a 4-stage pipeline");
  EXPECT_ERROR(make_schedule("fr", 3, 1), "fr with 1 micro-batches cannot fill a 3-stage pipeline");
  EXPECT_ERROR(make_schedule("ddg", 2, 4, true), "'ddg' has no weight stashing to synchronise (only pipedream has");
  EXPECT_ERROR(make_schedule("1f1b", 2, 4, true), "only pipedream has vertical sync");
  EXPECT_NO_THROW(make_schedule("PipeDream", 2, 4, true));
}

TEST(AsyncSchedules, ValidatorChecksDeclarationsAndBarriers) {
  for (const auto& name : {"pipedream", "ddg", "fr"}) {
    for (int k = 1; k <= 5; ++k) {
      for (int m = k; m <= 10; ++m) EXPECT_NO_THROW(validate(make_schedule(name, k, m), {1, true})) << name;
    }
  }
  EXPECT_NO_THROW(validate(make_pipedream(4, 9, true)));
  Schedule s = make_1f1b(2, 2);
  s.vertical_sync = true;
  EXPECT_ERROR(validate(s), "vertical sync is declared without weight stashing");
  s = make_1f1b(2, 2);
  s.weight_stashing = true;
  EXPECT_ERROR(validate(s), "weight stashing is declared but the optimizer steps once per batch");
  s = make_ddg(2, 3);
  s.barriers[1].pop_back();
  EXPECT_ERROR(validate(s), "worker 1 has 2 barriers, worker 0 has 3: every worker must meet every barrier");
  // A barrier that separates a forward from the activation it waits for deadlocks.
  EXPECT_ERROR(validate(Schedule::parse("| 0F0 0B0\n1F0 | 1B0\n")),
               "stage 1 blocks at 1F0 waiting for the activation of micro-batch 0 from stage 0");
  // Vertical sync on an order where stage 1 runs ahead of stage 0's versions is refused.
  Schedule ahead = Schedule::parse(
      "# schedule x stages=2 microbatches=3 weights=stashed step=microbatch sync=vertical\n"
      "0F0 0B0 0F1 0B1 0F2 0B2\n1F0 1F1 1B0 1F2 1B1 1B2\n");
  EXPECT_ERROR(validate(ahead),
               "action 1F1 (stage 1, position 1, forward of micro-batch 1): vertical sync needs "
               "weight version 1 but stage 1 has made only 0 updates by then");
}

TEST(AsyncSchedules, ForwardVersionsFollowTheDelays) {
  // Stage k's forward of t reads version max(0, t - d_k), d_k = K-1-k.
  const int k_stages = 4, m = 9;
  const auto versions = forward_versions(make_pipedream(k_stages, m));
  const auto vertical = forward_versions(make_pipedream(k_stages, m, true));
  for (int k = 0; k < k_stages; ++k) {
    for (int t = 0; t < m; ++t) {
      EXPECT_EQ(versions[k][t], std::max(0, t - (k_stages - 1 - k))) << "stage " << k << " mb " << t;
      EXPECT_EQ(vertical[k][t], std::max(0, t - (k_stages - 1))) << "stage " << k << " mb " << t;
    }
  }
}

// Marginal time per mini-batch in steady state: the makespan's growth per
// extra micro-batch, with equal costs f (forward) and b (backward) per stage.
double step_time(const std::string& name, int k, double f, double b) {
  const auto costs = StageCosts::uniform(k, f, b);
  const double m1 = simulate(make_schedule(name, k, 3 * k), costs).makespan;
  const double m2 = simulate(make_schedule(name, k, 3 * k + 10), costs).makespan;
  return (m2 - m1) / 10;
}

// The seed study's table, with T_F = K f and T_B = K b the whole model's
// forward and backward times. Features replay's backward replays the forward
// first: the table's T_B for it includes the replay, T_B' = K (f + b).
TEST(AsyncSchedules, SimulatedStepTimesMatchTheSeedTable) {
  const double f = 1.0, b = 2.0;
  for (int k = 2; k <= 6; ++k) {
    const double tf = k * f, tb = k * b;
    EXPECT_NEAR(step_time("sequential", k, f, b), tf + tb, 1e-9) << "K=" << k;
    EXPECT_NEAR(step_time("ddg", k, f, b), tf + tb / k, 1e-9) << "K=" << k;
    EXPECT_NEAR(step_time("fr", k, f, b), tf + k * (f + b) / k, 1e-9) << "K=" << k;
    EXPECT_NEAR(step_time("pipedream", k, f, b), (tf + tb) / k, 1e-9) << "K=" << k;
  }
}

TEST(AsyncSchedules, StageKHoldsKMinusKMicrobatches) {
  // 0-based stage k keeps K-k micro-batches: the seed's K-k+1 for 1-based k.
  for (const auto& name : {"pipedream", "ddg", "fr"}) {
    for (int k_stages = 2; k_stages <= 5; ++k_stages) {
      const Simulation sim = simulate(make_schedule(name, k_stages, 2 * k_stages), StageCosts::uniform(k_stages, 1, 2));
      for (int k = 0; k < k_stages; ++k) EXPECT_EQ(sim.peak_inflight[k], k_stages - k) << name << " stage " << k;
    }
  }
}

}  // namespace
}  // namespace conveyor::schedules
