// Balance::kTime's split: optimal (brute force agrees), atomic groups kept
// whole, memory budgets respected, and impossible budgets named.
#include "error_of.h"
#include "every_split.h"
#include "test_models.h"

#include "plugin/planner/balance_time.h"
#include "plugin/planner/planner.h"

#include <random>

namespace conveyor {
namespace {

using ::testing::HasSubstr;
using testing::error_of;

// Layer costs with additive stage seconds and bytes, and a transfer cost per cut.
struct Case {
  std::vector<double> seconds, cut_seconds;  // cut_seconds[b]: the cost a stage pays for a boundary at b
  std::vector<int64_t> bytes;
  std::vector<int64_t> stage_bytes;  // fixed bytes per stage index (a stage-dependent term, like in-flight counts)
  SplitCosts costs() const {
    SplitCosts c;
    c.num_layers = static_cast<int64_t>(seconds.size());
    c.seconds = [this](int, int64_t a, int64_t b) {
      double t = 0;
      for (int64_t i = a; i < b; ++i) t += seconds[i];
      if (a > 0) t += cut_seconds[a];
      if (b < static_cast<int64_t>(seconds.size())) t += cut_seconds[b];
      return t;
    };
    c.bytes = [this](int k, int64_t a, int64_t b) {
      int64_t total = stage_bytes.empty() ? 0 : stage_bytes[k];
      for (int64_t i = a; i < b; ++i) total += bytes[i];
      return total;
    };
    return c;
  }
};

using testing::every_split;

bool allowed(const SplitCosts& c, const std::vector<int64_t>& cuts) {
  for (int64_t b : cuts) {
    for (const auto& g : c.atomic_groups) {
      if (g.first < b && b <= g.last) return false;
    }
  }
  if (c.budgets.empty()) return true;
  int64_t begin = 0;
  for (size_t k = 0; k <= cuts.size(); ++k) {
    const int64_t end = k < cuts.size() ? cuts[k] : c.num_layers;
    if (c.bytes(static_cast<int>(k), begin, end) > c.budgets[k]) return false;
    begin = end;
  }
  return true;
}

TEST(BalanceTime, BruteForceAgreesOnRandomSmallCases) {
  std::mt19937 rng(7);
  int feasible = 0, infeasible = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t n = 2 + static_cast<int64_t>(rng() % 7);
    const int k = 1 + static_cast<int>(rng() % std::min<int64_t>(4, n));
    Case c;
    for (int64_t i = 0; i < n; ++i) {
      c.seconds.push_back(1 + rng() % 20);
      c.bytes.push_back(1 + rng() % 10);
    }
    for (int64_t i = 0; i <= n; ++i) c.cut_seconds.push_back(rng() % 4);
    for (int s = 0; s < k; ++s) c.stage_bytes.push_back(rng() % 5);
    SplitCosts costs = c.costs();
    if (rng() % 2) {
      const int64_t first = rng() % n, last = std::min<int64_t>(n - 1, first + rng() % 3);
      costs.atomic_groups.push_back({first, last});
    }
    if (rng() % 2) costs.budgets.assign(k, 8 + static_cast<int64_t>(rng() % 30));

    double best = std::numeric_limits<double>::infinity();
    std::vector<int64_t> cuts;
    every_split(n, k, cuts, [&](const std::vector<int64_t>& split) {
      if (allowed(costs, split)) best = std::min(best, bottleneck_seconds(costs, split));
    });
    const std::string where = "trial " + std::to_string(trial);
    if (std::isinf(best)) {
      ++infeasible;
      EXPECT_THROW(time_balanced_boundaries(costs, k), std::invalid_argument) << where;
      continue;
    }
    ++feasible;
    const std::vector<int64_t> got = time_balanced_boundaries(costs, k);
    ASSERT_EQ(got.size(), static_cast<size_t>(k - 1)) << where;
    EXPECT_TRUE(allowed(costs, got)) << where;
    EXPECT_DOUBLE_EQ(bottleneck_seconds(costs, got), best) << where;
  }
  EXPECT_GT(feasible, 100);  // both kinds of case were exercised
  EXPECT_GT(infeasible, 10);
}

TEST(BalanceTime, TransfersMoveTheCut) {
  // Without transfer costs the best cut is after layer 1 ({2,2} | {2,2}); a
  // costly boundary there pushes it to the cheap one after layer 2.
  Case c{{2, 2, 2, 2}, {0, 0, 0, 0, 0}, {1, 1, 1, 1}, {}};
  EXPECT_EQ(time_balanced_boundaries(c.costs(), 2), (std::vector<int64_t>{2}));
  c.cut_seconds = {0, 0, 5, 0, 0};
  EXPECT_EQ(time_balanced_boundaries(c.costs(), 2), (std::vector<int64_t>{1}));
}

TEST(BalanceTime, AtomicGroupsStayWhole) {
  // Alone, {1,1,1,1,1,1} | ... splits 3 | 3; layers 2..4 as a group forces 2 | 4 or 5 | 1.
  Case c{{1, 1, 1, 1, 1, 1}, std::vector<double>(7, 0.0), std::vector<int64_t>(6, 1), {}};
  SplitCosts costs = c.costs();
  EXPECT_EQ(time_balanced_boundaries(costs, 2), (std::vector<int64_t>{3}));
  costs.atomic_groups = {{2, 4}};
  EXPECT_EQ(time_balanced_boundaries(costs, 2), (std::vector<int64_t>{2}));
  costs.atomic_groups = {{0, 2}, {3, 5}};
  EXPECT_EQ(time_balanced_boundaries(costs, 2), (std::vector<int64_t>{3}));
  EXPECT_THAT(error_of([&] { time_balanced_boundaries(costs, 3); }),
              HasSubstr("3 stages asked for, but the atomic groups leave only 2 units of 6 layers"));
  costs.atomic_groups = {{4, 2}};
  EXPECT_THAT(error_of([&] { time_balanced_boundaries(costs, 2); }), HasSubstr("atomic group [4, 2] is not a range"));
  costs.atomic_groups = {{5, 6}};
  EXPECT_THAT(error_of([&] { time_balanced_boundaries(costs, 2); }), HasSubstr("atomic group [5, 6] is not a range"));
}

TEST(BalanceTime, BudgetsShapeTheSplitAndImpossibleOnesAreNamed) {
  // Time alone: 3 | 1 layers. Stage 0 may hold 2 layers' bytes only.
  Case c{{1, 1, 1, 3}, std::vector<double>(5, 0.0), {10, 10, 10, 10}, {}};
  SplitCosts costs = c.costs();
  costs.layer_names = {"a", "b", "c", "d"};
  EXPECT_EQ(time_balanced_boundaries(costs, 2), (std::vector<int64_t>{3}));
  costs.budgets = {20, 100};
  EXPECT_EQ(time_balanced_boundaries(costs, 2), (std::vector<int64_t>{2}));

  c.bytes = {10, 10, 45, 10};  // layer 2 fits no stage: 5 bytes over the largest budget
  costs = c.costs();
  costs.layer_names = {"a", "b", "c", "d"};
  costs.budgets = {40, 40};
  EXPECT_THAT(error_of([&] { time_balanced_boundaries(costs, 2); }),
              HasSubstr("layer 2 (c) does not fit any device's memory budget: on its own it needs 0.00 MiB (5 bytes) "
                        "more than stage 0's budget"));
  c.bytes = {10, 20, 25, 10};  // the group of layers 1..2 needs 45
  costs = c.costs();
  costs.atomic_groups = {{1, 2}};
  costs.budgets = {40, 40};
  EXPECT_THAT(error_of([&] { time_balanced_boundaries(costs, 2); }),
              HasSubstr("layers [1, 3), an atomic group, does not fit any device's memory budget: on its own it needs "
                        "0.00 MiB (5 bytes) more"));
  c.bytes = {30, 30, 30, 30};  // every layer fits, but 120 bytes do not fit in 2 x 50
  costs = c.costs();
  costs.budgets = {50, 50};
  EXPECT_THAT(error_of([&] { time_balanced_boundaries(costs, 2); }),
              HasSubstr("no split into 2 stages fits the memory budgets; the closest puts layers [0, 2) on stage 0, "
                        "0.00 MiB (10 bytes) over its budget"));
  costs.budgets = {50};
  EXPECT_THAT(error_of([&] { time_balanced_boundaries(costs, 2); }),
              HasSubstr("1 memory budgets given for 2 stages"));
}

TEST(BalanceTime, PlanStagesNeedsAProfileOfThisModel) {
  const auto mlp = testing::make_mlp();
  EXPECT_THAT(error_of([&] { split_stages(mlp, PipelineOptions().workers(2).balance(Balance::kTime)); }),
              HasSubstr("Balance::kTime needs the model's profile"));
  auto profile = std::make_shared<ModelProfile>();
  profile->layers.resize(3);
  EXPECT_THAT(error_of([&] {
                split_stages(mlp, PipelineOptions().workers(2).balance(Balance::kTime).profile(profile));
              }),
              HasSubstr("the profile describes 3 layers, the model has 7"));
}

TEST(BalanceTime, PlanStagesSplitsAProfileByTime) {
  // A hand-made profile: layer 5 is slow, so it gets a stage nearly to itself.
  auto profile = std::make_shared<ModelProfile>();
  profile->batch_size = 4;
  for (double t : {1.0, 1.0, 1.0, 1.0, 1.0, 9.0, 1.0}) {
    LayerProfile l;
    l.forward_seconds = t / 3;
    l.backward_seconds = 2 * t / 3;
    l.output_bytes = l.output_grad_bytes = 64;
    profile->layers.push_back(l);
  }
  const auto options = PipelineOptions().workers(2).balance(Balance::kTime).profile(profile);
  const StageSplit plan = split_stages(testing::make_mlp(), options);
  EXPECT_EQ(plan.str(), "stage 0: layers [0, 5) on cpu; stage 1: layers [5, 7) on cpu");
  // Layer 5 is 9 of the slowest stage's 10: it alone bounds the speed, 15 / 9 at best.
  const Prediction predicted = predict_step(testing::make_mlp(), options, 4);
  ASSERT_TRUE(predicted.bound.has_value());
  EXPECT_EQ(predicted.bound->layer, 5);
  EXPECT_NEAR(predicted.bound->best_speedup(), 15.0 / 9.0, 1e-9);
  EXPECT_THAT(predicted.str(), HasSubstr("alone bounds the speed"));
}

// Across processes whose workers keep every core busy, a transfer's
// processor time comes out of the compute: half on each side of a cut, on the
// forward and on the backward. With a core to spare, or none measured, it
// costs the compute nothing.
TEST(BalanceTime, ATransfersProcessorTimeIsPaidByBothStagesWhenTheCoresAreBusy) {
  const auto profile = [](int cores, double cpu) {
    auto p = std::make_shared<ModelProfile>();
    p->batch_size = 2;
    p->cores = cores;
    for (int i = 0; i < 7; ++i) {
      LayerProfile l;
      l.forward_seconds = 1e-3;
      l.backward_seconds = 2e-3;
      l.output_bytes = l.output_grad_bytes = 64;
      p->layers.push_back(l);
    }
    p->link.latency_seconds = 1e-4;
    p->link.cpu_seconds_per_transfer = cpu;
    return p;
  };
  const auto plan = [&](int workers, int cores, double cpu) {
    const auto options = PipelineOptions().workers(workers).microbatches(4).schedule("1f1b").profile(
        profile(cores, cpu));
    return predict_step(testing::make_mlp(), options, 8);
  };
  const Prediction free = plan(3, 2, 0), paid = plan(3, 2, 4e-4);
  ASSERT_EQ(paid.predicted.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    const double neighbours = k == 1 ? 2 : 1;
    EXPECT_NEAR(paid.predicted[k].forward_seconds - free.predicted[k].forward_seconds, 2e-4 * neighbours, 1e-12);
    EXPECT_NEAR(paid.predicted[k].backward_seconds - free.predicted[k].backward_seconds, 2e-4 * neighbours, 1e-12);
  }
  EXPECT_GT(paid.step_seconds(), free.step_seconds());
  for (const Prediction& spare : {plan(3, 4, 4e-4), plan(3, 0, 4e-4)}) {  // a core to spare; cores not counted
    for (size_t k = 0; k < 3; ++k) EXPECT_EQ(spare.predicted[k].forward_seconds, free.predicted[k].forward_seconds);
  }
}

}  // namespace
}  // namespace conveyor
