// Schedules as data: text form, generators, validator and simulator. No
// LibTorch: this binary builds and runs in seconds.
#include "error_of.h"
#include "schedules/generators.h"
#include "schedules/simulate.h"
#include "schedules/stash_memory.h"
#include "schedules/validate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace conveyor::schedules {
namespace {

using testing::error_of;

// Asynchronous methods need at least K micro-batches, dualpipev 2K.
int first_m(const std::string& name, int k) {
  if (name == "dualpipev") return 2 * k;
  return make_schedule(name, k, k).synchronous() && !is_interleaved(name) ? 1 : k;
}

// Interleaved schedules take whole rounds of K micro-batches.
bool takes(const std::string& name, int k, int m) { return !is_interleaved(name) || m % k == 0; }

// zb-interleaved fills its channels deeper than the others (see generators.h).
int capacity_for(const std::string& name) { return name == "zb-interleaved" ? 4 : 2; }

#define EXPECT_ERROR(stmt, text) \
  EXPECT_NE(error_of([&] { stmt; }).find(text), std::string::npos) << error_of([&] { stmt; })

TEST(Action, TextFormRoundTrips) {
  EXPECT_EQ(Action::parse("0F3"), (Action{0, ActionKind::kForward, 3}));
  EXPECT_EQ(Action::parse("12B0"), (Action{12, ActionKind::kBackward, 0}));
  EXPECT_EQ((Action{3, ActionKind::kBackward, 17}).str(), "3B17");
  EXPECT_ERROR(Action::parse("0X3"), "'0X3' is not an action (unknown kind");
  EXPECT_ERROR(Action::parse("F3"), "no stage number");
  EXPECT_ERROR(Action::parse("0F"), "no micro-batch number");
  EXPECT_ERROR(Action::parse("0F3x"), "trailing characters");
  EXPECT_ERROR(Action::parse("-1F3"), "no stage number");
}

TEST(Schedule, PrintsAndParsesAsText) {
  const Schedule s = make_1f1b(2, 2);
  EXPECT_EQ(s.str(), "# schedule 1f1b stages=2 microbatches=2\n0F0 0F1 0B0 0B1\n1F0 1B0 1F1 1B1\n");
  EXPECT_EQ(Schedule::parse(s.str()), s);
}

TEST(Schedule, ParsesWithoutHeaderAndWithCommas) {
  const Schedule s = Schedule::parse("\n0F0, 0F1, 0B0, 0B1\n# a comment\n1F0,1B0,1F1,1B1\n");
  EXPECT_EQ(s.num_stages, 2);
  EXPECT_EQ(s.num_microbatches, 2);
  EXPECT_EQ(s.name, "custom");
  EXPECT_EQ(s.workers, make_1f1b(2, 2).workers);
  EXPECT_ERROR(Schedule::parse("0F0 0Q1\n"), "schedule line 1: '0Q1' is not an action");
  EXPECT_ERROR(Schedule::parse("# schedule x stages=2 depth=3\n0F0\n"), "unknown header field 'depth=3'");
  EXPECT_ERROR(Schedule::parse("# only a comment\n"), "no action lines");
}

// Found by tests/fuzz (fuzz_schedule): a line of a form feed and a comma made a
// stage with no actions, which printed as an empty line that parse() refused.
TEST(Schedule, LinesOfOnlyWhitespaceAndSeparatorsAreBlank) {
  const Schedule s = Schedule::parse("\f,\n0F0 0B0\n\v , \t\n1F0 1B0\n");
  EXPECT_EQ(s.num_stages, 2);
  EXPECT_EQ(Schedule::parse(s.str()), s);
  EXPECT_ERROR(Schedule::parse("\f,\n"), "no action lines");
}

TEST(Generators, KnownShapes) {
  EXPECT_EQ(make_gpipe(2, 3).str(),
            "# schedule gpipe stages=2 microbatches=3\n0F0 0F1 0F2 0B0 0B1 0B2\n1F0 1F1 1F2 1B0 1B1 1B2\n");
  EXPECT_EQ(make_sequential(2, 2).str(),
            "# schedule sequential stages=2 microbatches=2\n0F0 0B0 0F1 0B1\n1F0 1B0 1F1 1B1\n");
  // 1F1B, 3 stages, 4 micro-batches: stage 0 warms up with 2 forwards.
  EXPECT_EQ(make_1f1b(3, 4).str(),
            "# schedule 1f1b stages=3 microbatches=4\n"
            "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3\n"
            "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3\n"
            "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3\n");
  EXPECT_EQ(make_schedule("GPipe", 2, 2), make_gpipe(2, 2));
  EXPECT_ERROR(make_schedule("zigzag", 2, 2),
               "unknown schedule 'zigzag' (known: sequential, gpipe, 1f1b, eager-1f1b, interleaved, zb-h1, "
               "zb-interleaved, zb-v, v-half, v-min, dualpipev, pipedream, ddg, fr)");
  EXPECT_ERROR(make_gpipe(0, 2), "at least 1 stage");
  EXPECT_ERROR(make_1f1b(2, 0), "at least 1 micro-batch");
}

// Every generated schedule of K = 1..6, M = 1..12 validates, at the default
// capacity and at capacity 1 (one undelivered message per channel).
TEST(Validate, AcceptsEveryGeneratedSchedule) {
  for (const auto& name : schedule_names()) {
    for (int k = 1; k <= 6; ++k) {
      for (int m = first_m(name, k); m <= 12; ++m) {
        if (!takes(name, k, m)) continue;
        const Schedule s = make_schedule(name, k, m);
        EXPECT_NO_THROW(validate(s, {capacity_for(name), true})) << name << " K=" << k << " M=" << m;
        if (name != "zb-interleaved") {
          EXPECT_NO_THROW(validate(s, {1, true})) << name << " K=" << k << " M=" << m;
        }
      }
    }
    EXPECT_NO_THROW(validate(make_forward_only(3, 5), {2, false}));
  }
}

TEST(Validate, RejectsBackwardBeforeForward) {
  EXPECT_ERROR(validate(Schedule::parse("0B0 0F0\n")),
               "action 0B0 (stage 0, position 0, backward of micro-batch 0): backward before its forward 0F0");
}

TEST(Validate, RejectsMissingActions) {
  EXPECT_ERROR(validate(Schedule::parse("# schedule x stages=2 microbatches=2\n0F0 0F1 0B0 0B1\n1F0 1B0\n")),
               "stage 1 never runs the forward of micro-batch 1 (no action 1F1)");
  EXPECT_ERROR(validate(Schedule::parse("0F0 0F1 0B0\n")),
               "stage 0 never runs the backward of micro-batch 1 (no action 0B1)");
  EXPECT_NO_THROW(validate(Schedule::parse("0F0 0F1\n"), {2, false}));
}

TEST(Validate, RejectsOutOfRangeRepeatedAndMisplacedActions) {
  EXPECT_ERROR(validate(Schedule::parse("# schedule x stages=1 microbatches=2\n0F0 0F5 0B0 0B5\n")),
               "action 0F5 (stage 0, position 1, forward of micro-batch 5): micro-batch out of range [0, 2)");
  EXPECT_ERROR(validate(Schedule::parse("0F0 0F0 0B0\n")),
               "action 0F0 (stage 0, position 1, forward of micro-batch 0) is repeated");
  EXPECT_ERROR(validate(Schedule::parse("0F0 0B0\n0F0 0B0\n")),
               "action 0F0 (stage 0, position 0, forward of micro-batch 0) is listed for stage 1");
  EXPECT_ERROR(validate(Schedule::parse("# schedule x stages=3 microbatches=1\n0F0 0B0\n")),
               "declares 3 stages but has only 2 actions");
}

TEST(Validate, RejectsDeadlocks) {
  // Stage 1 wants micro-batch 1 first, stage 0 sends 0 first; with one slot
  // the channel fills with 0 and both wait forever.
  const Schedule crossed = Schedule::parse("0F0 0F1 0F2 0B0 0B1 0B2\n1F1 1F0 1F2 1B0 1B1 1B2\n");
  EXPECT_ERROR(validate(crossed, {1, true}),
               "deadlocks under blocking transfers with channel capacity 1: stage 0 blocks at 0F1 sending the "
               "activation of micro-batch 1 to stage 1 (channel full); stage 1 blocks at 1F1 waiting for the "
               "activation of micro-batch 1 from stage 0");
  // With room for every message the same order runs.
  EXPECT_NO_THROW(validate(crossed, {3, true}));
  // Rendezvous channels deadlock 1F1B: stage 0 waits for stage 1 to take
  // micro-batch 1 while stage 1 waits for stage 0 to take a gradient.
  EXPECT_ERROR(validate(make_1f1b(2, 2), {0, true}), "deadlocks under blocking transfers with channel capacity 0");
  EXPECT_NO_THROW(validate(make_gpipe(3, 4), {0, true}));
  // A cycle: stage 0's backward needs stage 1's, which needs its forward, which stage 0 has not sent.
  EXPECT_ERROR(validate(Schedule::parse("0F0 0B0 0F1 0B1\n1F1 1B1 1F0 1B0\n")),
               "stage 0 blocks at 0B0 waiting for the gradient");
}

double expected_bubble(int k, int m) { return static_cast<double>(k - 1) / (m + k - 1); }

TEST(Simulate, GpipeAnd1f1bBubbleIsKMinusOneOverMPlusKMinusOne) {
  for (const char* name : {"gpipe", "1f1b"}) {
    for (int k = 1; k <= 6; ++k) {
      for (int m = 1; m <= 16; ++m) {
        for (double backward : {1.0, 2.0}) {
          const Simulation sim = simulate(make_schedule(name, k, m), StageCosts::uniform(k, 1.0, backward));
          EXPECT_NEAR(sim.bubble_fraction, expected_bubble(k, m), 1e-12) << name << " K=" << k << " M=" << m;
          EXPECT_NEAR(sim.makespan, (m + k - 1) * (1.0 + backward), 1e-12) << name << " K=" << k << " M=" << m;
        }
      }
    }
  }
}

TEST(Simulate, PeakInflight) {
  for (int k = 1; k <= 6; ++k) {
    for (int m = 1; m <= 12; ++m) {
      const auto costs = StageCosts::uniform(k, 1.0, 2.0);
      const Simulation f1b1 = simulate(make_1f1b(k, m), costs);
      const Simulation gpipe = simulate(make_gpipe(k, m), costs);
      const Simulation seq = simulate(make_sequential(k, m), costs);
      for (int s = 0; s < k; ++s) {
        EXPECT_EQ(f1b1.peak_inflight[s], std::min(m, k - s)) << "1f1b K=" << k << " M=" << m << " stage " << s;
        EXPECT_EQ(gpipe.peak_inflight[s], m) << "gpipe K=" << k << " M=" << m << " stage " << s;
        EXPECT_EQ(seq.peak_inflight[s], 1) << "sequential K=" << k << " M=" << m << " stage " << s;
      }
    }
  }
}

TEST(Simulate, SequentialRunsOneMicrobatchAtATime) {
  const Simulation sim = simulate(make_sequential(4, 3), StageCosts::uniform(4, 1.0, 2.0));
  EXPECT_DOUBLE_EQ(sim.makespan, 3 * 4 * 3.0);
  EXPECT_DOUBLE_EQ(sim.bubble_fraction, 0.75);
}

TEST(Simulate, TransferTimeAndUnequalStagesShowInTheMakespan) {
  // Two stages, one micro-batch: F0 on stage 0 (1), transfer (0.5), F0 on
  // stage 1 (3), B0 on stage 1 (4), transfer, B0 on stage 0 (2).
  const Simulation sim = simulate(make_gpipe(2, 1), StageCosts{{1, 3}, {2, 4}, 0.5, {}, {}, {}, 0, {}});
  EXPECT_DOUBLE_EQ(sim.makespan, 1 + 0.5 + 3 + 4 + 0.5 + 2);
  EXPECT_DOUBLE_EQ(sim.busy[1], 7);
  ASSERT_EQ(sim.timeline[0].size(), 2u);
  EXPECT_DOUBLE_EQ(sim.timeline[0][1].start, 9);
  EXPECT_ERROR(simulate(make_gpipe(2, 1), StageCosts::uniform(3, 1, 1)), "the schedule has 2");
  EXPECT_ERROR(simulate(Schedule::parse("0F0 0B0 0F1 0B1\n1F1 1B1 1F0 1B0\n"), StageCosts::uniform(2, 1, 1)),
               "waits forever");
}

TEST(Simulate, PerBoundaryTransfersOverrideTheCommonOne) {
  // Three stages, one micro-batch; boundary 0 costs 1, boundary 1 costs 2, each way.
  StageCosts costs = StageCosts::uniform(3, 1, 1, 100);
  costs.transfers = {1, 2};
  const Simulation sim = simulate(make_gpipe(3, 1), costs);
  EXPECT_DOUBLE_EQ(sim.makespan, 3 * 1 + 3 * 1 + 2 * (1 + 2));
}

TEST(StashMemory, PeakBytesFollowTheScheduleOrder) {
  // 1F1B, K=3, M=4, micro-batch mb stashes 10^mb bytes: stage 0 holds mb 0..2
  // before B0 frees 1, then adds 1000; stage 2 holds one at a time.
  std::vector<std::vector<int64_t>> bytes(3, std::vector<int64_t>{1, 10, 100, 1000});
  const std::vector<int64_t> peaks = peak_stash_bytes(make_1f1b(3, 4), bytes);
  EXPECT_EQ(peaks, (std::vector<int64_t>{1110, 1100, 1000}));
  EXPECT_EQ(peak_stash_bytes(make_gpipe(3, 4), bytes), (std::vector<int64_t>{1111, 1111, 1111}));
  // With one byte each it counts micro-batches in flight, as the simulator does.
  for (const auto& name : schedule_names()) {
    const Schedule s = make_schedule(name, 3, 6);
    const int n = s.num_stages;
    const auto counts = peak_stash_bytes(s, std::vector<std::vector<int64_t>>(n, std::vector<int64_t>(6, 1)));
    const Simulation sim = simulate(s, StageCosts::uniform(n, 1, 2));
    for (int k = 0; k < n; ++k) EXPECT_EQ(counts[k], sim.peak_inflight[k]) << name << " stage " << k;
  }
  EXPECT_ERROR(peak_stash_bytes(make_gpipe(3, 4), {{1}}), "sizes are given for 1 stages, the schedule has 3");
  EXPECT_ERROR(peak_stash_bytes(make_gpipe(1, 4), {{1, 2}}), "stage 0 has sizes for 2 micro-batches");
  EXPECT_EQ(microbatch_sizes(10, 4), (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_ERROR(microbatch_sizes(10, 0), "at least one micro-batch");
}

// Golden text of small schedules: tests/schedules/golden/<name>.txt holds every K = 2..4,
// M = 1..8 (M = K..8 for the asynchronous methods, which need M >= K), in
// that order. CONVEYOR_UPDATE_GOLDEN=1 rewrites them.
TEST(Golden, SmallSchedulesMatchTheirCheckedInText) {
  for (const auto& name : schedule_names()) {
    std::string generated;
    int expected = 0;
    for (int k = 2; k <= 4; ++k) {
      for (int m = first_m(name, k); m <= 8; ++m) {
        if (!takes(name, k, m)) continue;
        generated += make_schedule(name, k, m).str();
        ++expected;
      }
    }
    const std::string path = std::string(CONVEYOR_GOLDEN_DIR) + "/" + name + ".txt";
    if (std::getenv("CONVEYOR_UPDATE_GOLDEN")) {
      std::ofstream(path) << generated;
      continue;
    }
    std::ifstream in(path);
    ASSERT_TRUE(in) << "missing golden file " << path;
    std::stringstream golden;
    golden << in.rdbuf();
    EXPECT_EQ(golden.str(), generated) << name << ": generator output differs from " << path;
    // And the golden text parses back into valid schedules.
    const std::string text = golden.str();
    int count = 0;
    for (size_t at = text.find("# schedule"); at != std::string::npos; ++count) {
      const size_t next = text.find("# schedule", at + 1);
      const Schedule s = Schedule::parse(text.substr(at, next == std::string::npos ? next : next - at));
      EXPECT_NO_THROW(validate(s)) << s.str();
      at = next;
    }
    EXPECT_EQ(count, expected) << name;
  }
}

}  // namespace
}  // namespace conveyor::schedules
