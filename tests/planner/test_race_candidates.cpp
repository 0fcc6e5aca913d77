// Tuning: the search's first plans built and timed on the real batch, the
// fastest measured chosen, the model left as it was found.
#include "error_of.h"
#include "test_models.h"

#include "plugin/planner/search.h"
#include "plugin/measure/profile_model.h"
#include "plugin/measure/race_candidates.h"

#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <map>
#include <tuple>
#include <thread>

namespace conveyor {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::error_of;

// Linear layers with a batch norm among them (buffers that training moves).
torch::nn::Sequential tuned_model() {
  torch::nn::Sequential m(torch::nn::Linear(16, 32), torch::nn::Tanh(), torch::nn::BatchNorm1d(32),
                          torch::nn::Linear(32, 32), torch::nn::Tanh(), torch::nn::Linear(32, 8));
  m->to(torch::kFloat64);
  return m;
}

struct Sample {
  at::Tensor x = torch::randn({32, 16}, torch::kFloat64), y = torch::randn({32, 8}, torch::kFloat64);
};

const TensorsLossFn kMse = testing::mse_of_first;

SearchSpace two_worker_space() {
  SearchSpace space;
  space.max_workers = 2;
  space.schedules = {"gpipe", "1f1b"};
  space.microbatches = {1, 2, 4, 8};
  return space;
}

SearchResult search_for(const torch::nn::Sequential& model, const PipelineOptions& options) {
  return search_plans(model, options, 32, two_worker_space());
}

PipelineOptions profiled(const torch::nn::Sequential& model, const Sample& s) {
  return PipelineOptions().profile(std::make_shared<ModelProfile>(
      profile_model(model, s.x.narrow(0, 0, 8), s.y.narrow(0, 0, 8), testing::mse,
                    ProfileOptions().repeats(2).warmup(1).two_sizes(false))));
}

// The model, a batch, its profile and the search over two workers.
struct Searched {
  torch::nn::Sequential model = (torch::manual_seed(0), tuned_model());
  Sample s;
  PipelineOptions options = profiled(model, s);
  SearchResult search = search_for(model, options);
};

// A ranking made by hand: schedule, workers, micro-batches, predicted ms.
SearchResult ranking(const std::vector<std::tuple<std::string, int, int, double>>& plans) {
  SearchResult search;
  for (const auto& [schedule, workers, m, ms] : plans) {
    Candidate c;
    c.workers = workers;
    c.prediction.schedule.name = schedule;
    c.prediction.schedule.num_microbatches = m;
    c.prediction.simulation.makespan = ms / 1e3;
    search.ranked.push_back(c);
  }
  return search;
}

TEST(TunePlan, RacesTheFirstPlansThenNewWorkersMicrobatchesAndSchedulesInTurn) {
  const SearchResult search = ranking({{"1f1b", 2, 4, 10},
                                     {"1f1b", 2, 8, 10.5},
                                     {"1f1b", 2, 4, 11},  // recomputed: nothing new
                                     {"gpipe", 2, 4, 11.5},
                                     {"1f1b", 3, 4, 12},
                                     {"gpipe", 2, 8, 12.5},
                                     {"zb-h1", 4, 2, 13},
                                     {"zb-h1", 4, 1, 14},
                                     {"sequential", 1, 1, 16}});  // over 1.5 x the fastest
  using Picked = std::vector<size_t>;
  // Two leaders, then 3 workers, 2 micro-batches (zb-h1 on 4 workers), gpipe.
  EXPECT_EQ(pick_finalists(search, RaceOptions().finalists(5).leaders(2)), (Picked{0, 1, 3, 4, 6}));
  // No new worker count or schedule left: 1 micro-batch, then the ranking's next.
  EXPECT_EQ(pick_finalists(search, RaceOptions().finalists(6).leaders(2)), (Picked{0, 1, 3, 4, 6, 7}));
  EXPECT_EQ(pick_finalists(search, RaceOptions().finalists(7).leaders(2)), (Picked{0, 1, 2, 3, 4, 6, 7}));
  // Never past 1.5 x the fastest prediction (within()), however many are asked for.
  EXPECT_EQ(pick_finalists(search, RaceOptions().finalists(20)), (Picked{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(pick_finalists(search, RaceOptions().finalists(20).within(2)).size(), 9u);
  EXPECT_EQ(pick_finalists(search, RaceOptions().finalists(3).leaders(3)), (Picked{0, 1, 2}));
  // No leaders: the fastest is still first (its schedule is new), then the fastest new shape.
  EXPECT_EQ(pick_finalists(search, RaceOptions().finalists(2).leaders(0)), (Picked{0, 1}));
  EXPECT_EQ(pick_finalists(search, RaceOptions().finalists(1).within(1)), (Picked{0}));

  // A new number of workers before a new pair of numbers already seen.
  const SearchResult crowded = ranking({{"1f1b", 4, 2, 10},
                                      {"1f1b", 4, 4, 10.5},
                                      {"1f1b", 3, 2, 11},
                                      {"1f1b", 3, 4, 11.5},
                                      {"1f1b", 4, 8, 12},
                                      {"1f1b", 2, 2, 13}});
  EXPECT_EQ(pick_finalists(crowded, RaceOptions().finalists(5).leaders(2)), (Picked{0, 1, 2, 4, 5}));
  EXPECT_EQ(pick_finalists(crowded, RaceOptions().finalists(6).leaders(2)), (Picked{0, 1, 2, 3, 4, 5}));

  // A plan taken for its micro-batches does not stand for its worker count:
  // the best plan of 2 workers is 3, not 4 (taken for 8 micro-batches).
  const SearchResult stand_in = ranking({{"eager-1f1b", 4, 4, 10},
                                       {"eager-1f1b", 4, 4, 10.2},  // recomputed
                                       {"eager-1f1b", 3, 4, 10.4},
                                       {"eager-1f1b", 2, 4, 10.5},
                                       {"eager-1f1b", 2, 8, 11},
                                       {"eager-1f1b", 4, 1, 12}});
  EXPECT_EQ(pick_finalists(stand_in, RaceOptions().finalists(3).leaders(1)), (Picked{0, 2, 4}));
  EXPECT_EQ(pick_finalists(stand_in, RaceOptions().finalists(4).leaders(1)), (Picked{0, 2, 3, 4}));
}

TEST(TunePlan, RacesThePlansDroppingTheSlowerHalfAndChoosesTheFastestMeasured) {
  const Searched searched;
  const auto& [model, s, options, search] = searched;
  ASSERT_GE(search.ranked.size(), 4u);
  // The plans with the predicted-fastest plan's micro-batch size are made
  // slow: 20 ms in every loss call, far beyond this model's step.
  const int64_t slow_size = 32 / search.best().prediction.schedule.num_microbatches;
  const TensorsLossFn slowed = [slow_size](const Tensors& out, const Tensors& t) {
    if (out[0].size(0) == slow_size) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return torch::mse_loss(out[0], t[0]);
  };
  // The fastest predicted, then the best of another worker count, of another
  // micro-batch count (so at least one of another size) and the next.
  const RaceOptions four = RaceOptions().finalists(4).leaders(1).within(1e9);
  const std::vector<size_t> picked = pick_finalists(search, four);
  ASSERT_EQ(picked.size(), 4u);
  int other_sizes = 0;
  for (size_t i : picked) other_sizes += 32 / search.ranked[i].prediction.schedule.num_microbatches != slow_size;
  ASSERT_GE(other_sizes, 1) << search.str();
  const Race tuning = race_candidates(model, search, options, {s.x}, {s.y}, slowed, four);
  SCOPED_TRACE(tuning.str());
  ASSERT_EQ(tuning.finalists.size(), 4u);
  EXPECT_EQ(tuning.rounds, 2);  // 4 plans, then 2, then the faster one
  int second_round = 0;
  for (size_t i = 0; i < 4; ++i) {
    const RaceEntry& f = tuning.finalists[i];
    EXPECT_EQ(f.candidate.describe(), search.ranked[picked[i]].describe());
    EXPECT_EQ(f.predicted_seconds, search.ranked[picked[i]].prediction.step_seconds());
    EXPECT_TRUE(f.error.empty()) << f.error;
    EXPECT_EQ(f.step_seconds.size(), f.rounds == 1 ? 2u : 6u);  // 2 timed steps, then 4
    second_round += f.rounds == 2;
    const bool slow = 32 / f.candidate.prediction.schedule.num_microbatches == slow_size;
    if (slow && other_sizes >= 2) {
      EXPECT_EQ(f.rounds, 1) << "a slow plan went on: " << f.candidate.describe();
    }
  }
  EXPECT_EQ(second_round, 2);
  // Those dropped after the first round were the slower half in it.
  // The median of a plan's first round's two steps.
  const auto first_round = [](const RaceEntry& f) { return (f.step_seconds[0] + f.step_seconds[1]) / 2; };
  for (const RaceEntry& dropped : tuning.finalists) {
    for (const RaceEntry& kept : tuning.finalists) {
      if (dropped.rounds == 1 && kept.rounds == 2) {
        EXPECT_GE(first_round(dropped), first_round(kept));
      }
    }
  }
  const RaceEntry& chosen = tuning.finalists[tuning.best_index];
  EXPECT_EQ(chosen.rounds, 2);
  for (const RaceEntry& f : tuning.finalists) {
    if (f.rounds == 2) {
      EXPECT_GE(f.measured_seconds(), chosen.measured_seconds());
    }
  }
  EXPECT_NE(32 / tuning.best().prediction.schedule.num_microbatches, slow_size) << tuning.best().describe();
  EXPECT_THAT(tuning.str(), AllOf(HasSubstr("raced 4 plans over 2 rounds"),
                                  HasSubstr("* " + tuning.best().describe() + ": predicted")));

  // One round: every plan timed once, the fastest of all chosen.
  const Race once = race_candidates(model, search, options, {s.x}, {s.y}, slowed, RaceOptions(four).rounds(1));
  EXPECT_EQ(once.rounds, 1);
  for (const RaceEntry& f : once.finalists) {
    EXPECT_EQ(f.rounds, 1);
    EXPECT_GE(f.measured_seconds(), once.finalists[once.best_index].measured_seconds());
  }
  EXPECT_NE(32 / once.best().prediction.schedule.num_microbatches, slow_size) << once.best().describe();
}

TEST(TunePlan, LeavesTheModelAsItFoundItAndTheChosenPlanTrainsExactly) {
  torch::manual_seed(0);
  auto model = tuned_model();
  const Sample s;
  testing::mse(model->forward(s.x), s.y).backward();  // gradients the tuning must keep
  auto reference = testing::clone_of(model);
  std::map<std::string, at::Tensor> grads;
  for (const auto& item : model->named_parameters()) grads[item.key()] = item.value().grad().clone();
  // Two plans per round with the pipeline's own optimizer: it steps the weights.
  const PipelineOptions options = profiled(model, s).optimizer(testing::sgd(0.1));
  const SearchResult search = search_for(model, options);
  const at::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
  const Race tuning = race_candidates(model, search, options, {s.x}, {s.y}, kMse, RaceOptions().finalists(2));
  EXPECT_TRUE(at::equal(rng, at::detail::getDefaultCPUGenerator().get_state()));
  const auto got = model->named_parameters();
  for (const auto& item : reference->named_parameters()) {
    EXPECT_TRUE(at::equal(got[item.key()], item.value())) << item.key();
    EXPECT_TRUE(at::equal(got[item.key()].grad(), grads.at(item.key()))) << item.key();
  }
  const auto buffers = model->named_buffers();
  for (const auto& item : reference->named_buffers()) {
    EXPECT_TRUE(at::equal(buffers[item.key()], item.value())) << item.key();
  }

  // The chosen plan, built on the tuned model, trains as the unsplit model.
  for (const auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
  for (const auto& p : reference->parameters()) p.mutable_grad() = at::Tensor();
  StageRunner pipe(model, tuning.best().options(profiled(model, s)));
  const int m = pipe.schedule().num_microbatches;
  pipe.train_step(s.x, s.y, testing::mse);
  reference->train();
  for (int k = 0; k < m; ++k) {  // the batch norm sees each micro-batch alone, as in the pipeline
    const auto xs = s.x.tensor_split(m), ys = s.y.tensor_split(m);
    (testing::mse(reference->forward(xs[k]), ys[k]) / m).backward();
  }
  testing::expect_same_grads(pipe, reference, 1e-12, 1e-10, tuning.best().describe());
}

TEST(TunePlan, AFinalistThatFailsIsSkippedAndNamed) {
  const Searched searched;
  const auto& [model, s, options, search] = searched;
  const int64_t failing = 32 / search.best().prediction.schedule.num_microbatches;
  const TensorsLossFn picky = [failing](const Tensors& out, const Tensors& t) {
    if (out[0].size(0) == failing) throw std::runtime_error("no micro-batches of " + std::to_string(failing));
    return torch::mse_loss(out[0], t[0]);
  };
  // Another micro-batch count among the finalists, whatever the profile ranked first.
  const Race tuning =
      race_candidates(model, search, options, {s.x}, {s.y}, picky, RaceOptions().finalists(4).leaders(1).within(1e9));
  SCOPED_TRACE(tuning.str());
  EXPECT_THAT(tuning.finalists.front().error, HasSubstr("no micro-batches of " + std::to_string(failing)));
  EXPECT_EQ(tuning.finalists.front().measured_seconds(), 0.0);
  EXPECT_NE(32 / tuning.best().prediction.schedule.num_microbatches, failing);
  EXPECT_THAT(tuning.str(), HasSubstr("failed: "));

  const TensorsLossFn broken = [](const Tensors&, const Tensors&) -> at::Tensor {
    throw std::runtime_error("the loss is broken");
  };
  EXPECT_THAT(error_of([&] { race_candidates(model, search, options, {s.x}, {s.y}, broken); }),
              AllOf(HasSubstr("every finalist failed"), HasSubstr("the loss is broken")));
  EXPECT_THAT(testing::invalid_argument_of(
                  [&] { race_candidates(model, search, options, {s.x}, {s.y}, kMse, RaceOptions().steps(0)); }),
              HasSubstr("finalists and steps must be positive"));
  EXPECT_THAT(testing::invalid_argument_of(
                  [&] { race_candidates(model, search, options, {s.x}, {s.y}, kMse, RaceOptions().within(0.5)); }),
              HasSubstr("within at least 1, got 12, 2, 4, 0, 2 and 0.5"));
  EXPECT_THAT(testing::invalid_argument_of(
                  [&] { race_candidates(model, SearchResult{}, options, {s.x}, {s.y}, kMse); }),
              HasSubstr("the search found no plan to measure"));
  // Nothing failed to leave behind: the weights still train.
  for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
}

}  // namespace
}  // namespace conveyor
