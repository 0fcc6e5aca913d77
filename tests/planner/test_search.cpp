// The whole-plan search: its choice against brute force over every split,
// memory budgets it keeps (or names the closest miss of), and the pipeline
// built from its plan running that plan with exact gradients.
#include "error_of.h"
#include "every_split.h"
#include "planner/six_layers.h"
#include "test_models.h"

#include "plugin/planner/partition.h"
#include "plugin/planner/planner.h"
#include "plugin/planner/search.h"
#include "schedules/generators.h"

#include <functional>

namespace conveyor {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::error_of;

using testing::every_split;

// The fastest predicted step of `space` over every split (not only the
// time-balanced ones) whose every worker fits the budget.
double brute_force_best(const torch::nn::Sequential& model, const PipelineOptions& base, int64_t batch,
                        const SearchSpace& space, int& priced) {
  double best = std::numeric_limits<double>::infinity();
  for (int w = 1; w <= space.max_workers; ++w) {
    for (const auto& name : space.schedules) {
      for (int v : schedules::is_interleaved(name) ? space.chunks : std::vector<int>{1}) {
        if (w * v > static_cast<int>(model->size())) continue;
        // Each stash: the graph or the inputs (recompute), and on an
        // accelerator the inputs in host memory (offload).
        std::vector<std::pair<bool, bool>> stashes;
        for (bool r : space.recompute) stashes.emplace_back(r, false);
        if (!base.profile()->host_link.kind.empty()) stashes.emplace_back(false, true);
        for (int m : space.microbatches) {
          for (const auto& [r, o] : stashes) {
            std::vector<int64_t> cuts;
            every_split(static_cast<int64_t>(model->size()), w * v, cuts, [&](const std::vector<int64_t>& split) {
              Candidate c;
              c.workers = w;
              c.chunks = v;
              c.recompute = r;
              c.offload = o;
              const auto options = PipelineOptions(base)
                                       .workers(w)
                                       .chunks(schedules::is_interleaved(name) ? v : 0)
                                       .schedule(name)
                                       .microbatches(m)
                                       .recompute(r)
                                       .offload(o)
                                       .boundaries(split);
              try {
                c.prediction = predict_step(model, options, batch);
              } catch (const std::invalid_argument&) {
                return;  // a schedule that cannot run this shape
              }
              std::vector<int64_t> bytes(static_cast<size_t>(w), 0);
              for (size_t k = 0; k < c.prediction.predicted.size(); ++k) {
                bytes[static_cast<size_t>(c.prediction.schedule.worker_of(static_cast<int>(k)))] +=
                    c.prediction.predicted[k].peak_bytes();
              }
              ++priced;
              const int64_t peak = *std::max_element(bytes.begin(), bytes.end());
              if (space.memory_budget > 0 && peak > space.memory_budget) return;
              best = std::min(best, c.prediction.step_seconds());
            });
          }
        }
      }
    }
  }
  return best;
}

SearchSpace small_space() {
  SearchSpace space;
  space.max_workers = 3;
  space.schedules = {"sequential", "gpipe", "1f1b", "interleaved", "zb-h1", "zb-interleaved"};
  space.microbatches = {1, 2, 4, 8};
  space.chunks = {2};
  space.synthesise = false;  // brute force prices the fixed families' orders only
  return space;
}

TEST(SearchPlans, TheChoiceIsWithinTwoPercentOfBruteForceOverEverySplit) {
  const auto model = six_layers();
  const auto base = PipelineOptions().profile(six_layer_profile());
  for (int64_t budget : {int64_t{0}, int64_t{400000}, int64_t{250000}}) {
    SearchSpace space = small_space();
    space.memory_budget = budget;
    const SearchResult search = search_plans(model, base, 32, space);
    int priced = 0;
    const double brute = brute_force_best(model, base, 32, space, priced);
    SCOPED_TRACE(search.str());
    // 3 workers, 6 schedules (2 chunks for the interleaved), 4 micro-batch
    // counts, with and without recomputation; every split of each.
    EXPECT_EQ(search.considered, 3 * 6 * 4 * 2);
    EXPECT_GT(priced, 600);  // of 768 (shapes a schedule cannot run are left out)
    EXPECT_GE(search.best().prediction.step_seconds(), brute * (1 - 1e-12)) << "budget " << budget;
    EXPECT_LE(search.best().prediction.step_seconds(), brute * 1.02) << "budget " << budget;
    for (size_t i = 1; i < search.ranked.size(); ++i) {
      // Fastest first (ties to rounding go to less memory).
      EXPECT_LE(search.ranked[i - 1].prediction.step_seconds(), search.ranked[i].prediction.step_seconds() * (1 + 1e-9));
    }
    for (const auto& c : search.ranked) {
      if (budget > 0) {
        EXPECT_LE(c.peak_bytes(), budget) << c.describe();
      }
    }
  }
}

TEST(SearchPlans, ATighterBudgetTradesSpeedForMemoryAndSaysWhatMisses) {
  const auto model = six_layers();
  const auto base = PipelineOptions().profile(six_layer_profile());
  SearchSpace space = small_space();
  const SearchResult free = search_plans(model, base, 32, space);
  EXPECT_EQ(free.over_budget, 0);
  // Half the fastest plan's memory: it no longer fits; what does is slower.
  space.memory_budget = free.best().peak_bytes() / 2;
  const SearchResult tight = search_plans(model, base, 32, space);
  EXPECT_GT(tight.over_budget, 0);
  EXPECT_LE(tight.best().peak_bytes(), space.memory_budget);
  EXPECT_GE(tight.best().prediction.step_seconds(), free.best().prediction.step_seconds());
  // On one worker, below the least any plan without recomputation needs,
  // only recomputation (which keeps a stage's inputs alone) fits.
  SearchSpace one = small_space();
  one.max_workers = 1;
  one.recompute = {false};
  const SearchResult plain = search_plans(model, base, 32, one);
  int64_t least = std::numeric_limits<int64_t>::max();
  for (const auto& c : plain.ranked) least = std::min(least, c.peak_bytes());
  one.recompute = {false, true};
  one.memory_budget = least - 1;
  const SearchResult recomputing = search_plans(model, base, 32, one);
  for (const auto& c : recomputing.ranked) EXPECT_TRUE(c.recompute) << c.describe();
  EXPECT_GT(recomputing.over_budget, 0);

  space.memory_budget = 1000;
  EXPECT_THAT(error_of([&] { search_plans(model, base, 32, space); }),
              AllOf(HasSubstr("no plan fits a memory budget of 0.00 MiB (1000 bytes) per worker"),
                    HasSubstr("the closest: "), ::testing::ContainsRegex("closest: [a-z0-9-]+, 1 worker, [1-9]"),
                    ::testing::Not(HasSubstr(" 0 micro-batches"))));
  EXPECT_THAT(error_of([&] { search_plans(model, PipelineOptions(), 32, small_space()); }),
              HasSubstr("needs the model's profile"));
}

// On an accelerator (a profile with a copy to host memory), offloading is a
// third stash: it keeps the device's share of the stash at two micro-batches,
// so it fits where recomputation does not, at recomputation's speed while the
// copies hide behind the compute; a slow copy makes it slower. On a CPU the
// search leaves it out (it would be recomputation again).
TEST(SearchPlans, OnAnAcceleratorOffloadingFitsWhereRecomputationDoesNot) {
  const auto model = six_layers();
  auto profile = six_layer_profile();
  SearchSpace one = small_space();
  one.max_workers = 1;
  one.schedules = {"gpipe"};  // all its micro-batches in flight
  const SearchResult on_cpu = search_plans(model, PipelineOptions().profile(profile), 32, one);
  EXPECT_EQ(on_cpu.considered, 4 * 2);
  for (const auto& c : on_cpu.ranked) EXPECT_FALSE(c.offload) << c.describe();
  int64_t least = std::numeric_limits<int64_t>::max();  // the least any plan without offloading needs
  for (const auto& c : on_cpu.ranked) least = std::min(least, c.peak_bytes());

  profile->device = "cuda:0";
  profile->host_link = LinkProfile{"cuda:0 -> cpu copy", 10e-6, 20e9};  // an entry (1 KiB) in 10 us
  const auto base = PipelineOptions().profile(profile);
  const SearchResult all = search_plans(model, base, 32, one);
  EXPECT_EQ(all.considered, 4 * 3);
  const auto find = [](const SearchResult& s, const std::string& schedule, int m, bool recompute, bool offload) {
    for (const auto& c : s.ranked) {
      if (c.prediction.schedule.name == schedule && c.prediction.schedule.num_microbatches == m && c.recompute == recompute &&
          c.offload == offload) {
        return c;
      }
    }
    ADD_FAILURE() << "no " << schedule << " M = " << m << (offload ? " offloading" : "") << " in\n" << s.str(64);
    return Candidate{};
  };
  const Candidate recomputing = find(all, "gpipe", 8, true, false), offloading = find(all, "gpipe", 8, false, true);
  EXPECT_THAT(offloading.describe(), HasSubstr("gpipe, 1 worker, 8 micro-batches, offload"));
  EXPECT_DOUBLE_EQ(offloading.prediction.step_seconds(), recomputing.prediction.step_seconds());
  // GPipe holds all 8 micro-batches' inputs: 6 of them wait in host memory.
  const StagePrediction& p = offloading.prediction.predicted[0];
  EXPECT_EQ(p.stash_bytes, recomputing.prediction.predicted[0].stash_bytes);
  EXPECT_EQ(p.offloaded_bytes, p.stash_bytes * 6 / 8);
  EXPECT_EQ(offloading.peak_bytes(), recomputing.peak_bytes() - p.offloaded_bytes);
  EXPECT_THAT(offloading.prediction.str(), HasSubstr("in host memory"));
  EXPECT_TRUE(offloading.options(PipelineOptions()).offload());
  EXPECT_FALSE(offloading.options(PipelineOptions()).recompute());

  one.memory_budget = least - 1;
  const SearchResult tight = search_plans(model, base, 32, one);
  SCOPED_TRACE(tight.str());
  for (const auto& c : tight.ranked) EXPECT_TRUE(c.offload) << c.describe();
  int priced = 0;
  const double brute = brute_force_best(model, base, 32, one, priced);
  EXPECT_GE(tight.best().prediction.step_seconds(), brute * (1 - 1e-12));
  EXPECT_LE(tight.best().prediction.step_seconds(), brute * 1.02);

  // Copies of 1 KiB at 10 kB/s (0.1 s each way) outlast the 64 ms of compute
  // each micro-batch's forward, replay and backward take: the backward waits.
  profile->host_link = LinkProfile{"slow copy", 10e-6, 1e4};
  one.memory_budget = 0;
  const SearchResult slow = search_plans(model, PipelineOptions().profile(profile), 32, one);
  const Candidate slow_offloading = find(slow, "gpipe", 8, false, true);
  EXPECT_GT(slow_offloading.prediction.step_seconds(), recomputing.prediction.step_seconds() * 1.05);
  EXPECT_FALSE(slow.best().offload) << slow.str();
}

TEST(SearchPlans, ThePipelineBuiltFromThePlanRunsItWithExactGradients) {
  torch::manual_seed(0);
  auto mlp = testing::make_mlp();
  const at::Tensor x = torch::randn({16, 8}, torch::kFloat64), y = torch::randn({16, 3}, torch::kFloat64);
  auto profile = std::make_shared<ModelProfile>(
      profile_model(mlp, x.narrow(0, 0, 4), y.narrow(0, 0, 4), testing::mse, ProfileOptions().warmup(0).repeats(1)));
  SearchSpace space;
  space.max_workers = 2;
  space.microbatches = {2, 4};
  const SearchResult search = search_plans(mlp, PipelineOptions().profile(profile), 16, space);
  EXPECT_THAT(search.str(), AllOf(HasSubstr("the fastest:"), HasSubstr("rank")));
  // The best and a runner-up of another shape: each built, run and exact.
  std::vector<const Candidate*> picks = {&search.best()};
  for (const auto& c : search.ranked) {
    if (c.workers != search.best().workers || c.prediction.schedule.name != search.best().prediction.schedule.name) {
      picks.push_back(&c);
      break;
    }
  }
  for (const Candidate* choice : picks) {
    SCOPED_TRACE(choice->describe());
    auto reference = testing::clone_of(mlp);
    testing::mse(reference->forward(x), y).backward();
    auto model = testing::clone_of(mlp);
    StageRunner pipe(model, choice->options(PipelineOptions().profile(profile)));
    ASSERT_EQ(pipe.num_stages(), static_cast<int>(choice->prediction.split.stages.size()));
    for (int k = 0; k < pipe.num_stages(); ++k) {
      EXPECT_EQ(pipe.split().stages[k].begin, choice->prediction.split.stages[k].begin);
      EXPECT_EQ(pipe.split().stages[k].end, choice->prediction.split.stages[k].end);
    }
    EXPECT_EQ(pipe.schedule().name, choice->prediction.schedule.name);
    EXPECT_EQ(pipe.schedule().num_microbatches, choice->prediction.schedule.num_microbatches);
    EXPECT_EQ(pipe.num_workers(), choice->workers);
    pipe.train_step(x, y, testing::mse);
    testing::expect_same_grads(pipe, reference, 1e-12, 1e-10, choice->describe());
  }
}

// Synthesised schedules join the search. With a budget between what 1F1B and
// ZB-H1 need on 3 workers, ZB-H1 no longer fits and the synthesised schedule
// (ZB-H1's split, an order that holds less) is faster than 1F1B; the pipeline
// built from the plan runs that schedule, as text, with exact gradients.
TEST(SearchPlans, ASynthesisedScheduleUsesABudgetBetween1F1BAndZbH1) {
  torch::manual_seed(0);
  auto mlp = testing::make_mlp();
  const at::Tensor x = torch::randn({32, 8}, torch::kFloat64), y = torch::randn({32, 3}, torch::kFloat64);
  const auto base = PipelineOptions().profile(six_layer_profile());
  SearchSpace space;
  space.max_workers = 3;
  space.schedules = {"1f1b", "zb-h1"};
  space.microbatches = {8};
  space.recompute = {false};
  space.synthesise = false;
  const auto fixed = search_plans(six_layers(), base, 32, space);
  int64_t one_f_one_b = 0, zb_h1 = 0;
  double one_f_one_b_step = 0;
  for (const auto& c : fixed.ranked) {
    if (c.workers != 3) continue;
    if (c.prediction.schedule.name == "1f1b") one_f_one_b = c.peak_bytes(), one_f_one_b_step = c.prediction.step_seconds();
    if (c.prediction.schedule.name == "zb-h1") zb_h1 = c.peak_bytes();
  }
  ASSERT_LT(one_f_one_b, zb_h1);
  space.memory_budget = (one_f_one_b + zb_h1) / 2;
  space.synthesise = true;
  const SearchResult search = search_plans(six_layers(), base, 32, space);
  SCOPED_TRACE(search.str());
  const Candidate& best = search.best();
  EXPECT_EQ(best.prediction.schedule.name, "synthesised");
  EXPECT_LE(best.peak_bytes(), space.memory_budget);
  EXPECT_LT(best.prediction.step_seconds(), one_f_one_b_step);
  for (const auto& c : search.ranked) EXPECT_NE(c.prediction.schedule.name, "zb-h1") << "ZB-H1 does not fit";

  // The synthesised plan, built and run on a model of the same depth.
  auto profile = std::make_shared<ModelProfile>(
      profile_model(mlp, x.narrow(0, 0, 4), y.narrow(0, 0, 4), testing::mse, ProfileOptions().warmup(0).repeats(1)));
  SearchSpace small;
  small.max_workers = 2;
  small.schedules = {"zb-h1"};
  small.microbatches = {4};
  small.recompute = {false};
  const SearchResult found = search_plans(mlp, PipelineOptions().profile(profile), 32, small);
  const Candidate* synthesised = nullptr;
  for (const auto& c : found.ranked) {
    if (c.prediction.schedule.name == "synthesised" && c.workers == 2) synthesised = &c;
  }
  ASSERT_NE(synthesised, nullptr) << found.str();
  auto reference = testing::clone_of(mlp);
  testing::mse(reference->forward(x), y).backward();
  auto model = testing::clone_of(mlp);
  StageRunner pipe(model, synthesised->options(PipelineOptions().profile(profile)));
  EXPECT_EQ(pipe.schedule().str(), synthesised->prediction.schedule.str());
  pipe.train_step(x, y, testing::mse);
  testing::expect_same_grads(pipe, reference, 1e-12, 1e-10, synthesised->describe());
}

// A link whose latency is a micro-batch's compute: 1F1B waits a round trip
// per micro-batch, eager-1f1b does not, and the search picks it (with
// channels for the forwards ahead); with a free link it keeps 1F1B, which
// stashes less for the same step. The pipeline built from it runs it, exactly.
TEST(SearchPlans, ASlowLinkMakesItRunForwardsAheadExactly) {
  auto profile = six_layer_profile();  // 18 ms of compute per micro-batch of 4 samples
  SearchSpace space;
  space.max_workers = 2;
  space.schedules = {"1f1b", "eager-1f1b"};
  space.microbatches = {8};
  space.recompute = {false};
  const auto layers = six_layers();
  profile->link = LinkProfile{"free", 0, 0};
  const SearchResult free = search_plans(layers, PipelineOptions().profile(profile), 32, space);
  EXPECT_EQ(free.best().prediction.schedule.name, "1f1b") << free.str();
  profile->link = LinkProfile{"slow", 0.004, 0};
  const SearchResult slow = search_plans(layers, PipelineOptions().profile(profile), 32, space);
  SCOPED_TRACE(slow.str());
  const Candidate& best = slow.best();
  ASSERT_EQ(best.prediction.schedule.name, "eager-1f1b");
  EXPECT_EQ(best.workers, 2);
  EXPECT_GE(best.lookahead, 1);
  EXPECT_THAT(best.describe(), HasSubstr("eager-1f1b +" + std::to_string(best.lookahead) + ", 2 workers"));
  double plain = 0;  // 1F1B's best step on the slow link
  for (const auto& c : slow.ranked) {
    if (c.prediction.schedule.name == "1f1b" && c.workers == 2) plain = c.prediction.step_seconds();
  }
  EXPECT_LT(best.prediction.step_seconds(), 0.95 * plain);
  const PipelineOptions options = best.options(PipelineOptions().profile(profile));
  EXPECT_EQ(options.lookahead(), best.lookahead);
  EXPECT_GE(channel_capacity_for(options), best.lookahead + 1);
  torch::manual_seed(0);
  auto mlp = six_layers();
  mlp->to(torch::kFloat64);
  const at::Tensor x = torch::randn({32, 64}, torch::kFloat64), y = torch::randn({32, 64}, torch::kFloat64);
  auto reference = testing::clone_of(mlp);
  testing::mse(reference->forward(x), y).backward();
  auto model = testing::clone_of(mlp);
  StageRunner pipe(model, options);
  EXPECT_EQ(pipe.schedule(), schedules::make_eager_1f1b(2, 8, best.lookahead));
  pipe.train_step(x, y, testing::mse);
  testing::expect_same_grads(pipe, reference, 1e-12, 1e-10, best.describe());
}

// A worker of two chunks (a V, or interleaved) holds its stages'
// micro-batches as its line orders them, not each stage's peak at once: its
// predicted bytes are its stages' weights and states and the most their
// in-flight micro-batches take together, walked here action by action, and at
// most the sum of the stages' peaks (less on some worker of each). A worker of
// one stage holds that stage's peak.
TEST(SearchPlans, AWorkerOfTwoChunksHoldsItsMicroBatchesAsItsLineOrdersThem) {
  for (const char* name : {"zb-v", "v-min", "interleaved", "1f1b"}) {
    const int chunks = schedules::default_chunks(name);
    const auto options = PipelineOptions().workers(6 / chunks).chunks(chunks).microbatches(12).schedule(name)
                             .balance(Balance::kUniform).profile(six_layer_profile());
    const Prediction plan = predict_step(six_layers(), options, 48);  // 4 samples a micro-batch, as profiled
    ASSERT_EQ(plan.predicted.size(), 6u) << name;
    ASSERT_EQ(plan.worker_bytes.size(), static_cast<size_t>(6 / chunks)) << name;
    bool less = false;
    for (int w = 0; w < 6 / chunks; ++w) {
      int64_t sum = 0, fixed = 0, held = 0, most = 0;
      for (int k = 0; k < 6; ++k) {
        if (plan.schedule.worker_of(k) != w) continue;
        const StagePrediction& sp = plan.predicted[k];
        sum += sp.peak_bytes();
        fixed += sp.peak_bytes() - sp.stash_bytes - sp.activation_bytes;
      }
      for (const schedules::Action& a : plan.schedule.workers[w]) {
        const StagePrediction& sp = plan.predicted[a.stage];
        const int64_t each = (sp.stash_bytes + sp.activation_bytes) / sp.peak_inflight;  // equal micro-batches
        if (a.kind == schedules::ActionKind::kForward) held += each;
        if (a.kind == schedules::ActionKind::kBackward || a.kind == schedules::ActionKind::kWeight) held -= each;
        most = std::max(most, held);
      }
      const std::string where = std::string(name) + " worker " + std::to_string(w);
      EXPECT_EQ(plan.worker_bytes[w], chunks == 1 ? sum : fixed + most) << where;
      EXPECT_LE(plan.worker_bytes[w], sum) << where;
      less = less || plan.worker_bytes[w] < sum;
    }
    EXPECT_EQ(less, chunks > 1) << name;
  }
}

}  // namespace
}  // namespace conveyor
