#pragma once
// Choosing among the planner's plans by running them. The search
// (plugin/planner/search.h) ranks every plan by its predicted step; on a CPU
// shared by the workers a prediction misses by 5-30 % (benchmarks/results/
// choice.md), more than separates the first plans of the ranking, and a
// profile that misprices one micro-batch size or crowded cores can rank the
// fastest plan far down. race_candidates races a diverse set of plans on the model
// and the real batch: the first of the ranking, then the best predicted of
// each other number of workers and micro-batches; each round every plan
// still in is built and timed (the plans taking turns), the slower half is
// dropped, until one is left. It returns every finalist's prediction and
// measurement, the fastest measured chosen. With the defaults (12 plans,
// then 6, 3, 2; 2, 4, 6, 8 timed steps after 2 warm-up steps each) it costs
// about 130 training steps before the run.
//
//   const conveyor::SearchResult search = conveyor::search_plans(model, options, batch, space);
//   const conveyor::Race tuning = conveyor::race_candidates(model, search, options, {x}, {y}, loss);
//   std::cout << tuning.str();
//   conveyor::Pipeline pipe(model, tuning.best().options(options));

#include "plugin/core/options.h"
#include "plugin/planner/search.h"
#include "plugin/core/types.h"

#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>

#include <string>
#include <vector>

namespace conveyor {

struct RaceOptions {
  // Plans timed in the first round (fewer if the search found fewer).
  TORCH_ARG(int, finalists) = 12;
  // Of them, the ranking's first this many; then, taking turns, the best
  // predicted plan of a number of workers, of a number of micro-batches and
  // of a schedule whose best is not yet among them (what a profile
  // misprices most: crowded cores, small micro-batches, close calls), then
  // of a pair of the two numbers; then the ranking's next.
  TORCH_ARG(int, leaders) = 4;
  // Plans predicted slower than this times the fastest prediction are not timed.
  TORCH_ARG(double, within) = 1.5;
  // Per round, each plan still in is built, runs `warmup` steps (a new
  // pipeline's second step is still 10-15 % slow on a CPU: its allocations
  // settle), then this many timed steps in the first round, twice as many in the second,
  // three times in the third... (the closer the plans left, the more steps
  // tell them apart); the rounds take the plans in turn, forwards then
  // backwards, so that a machine slowing down or speeding up favours none.
  // After a round the slower half (by the median of all their steps) is dropped.
  TORCH_ARG(int, steps) = 2;
  TORCH_ARG(int, warmup) = 2;
  // At most this many rounds; 0: until one plan is left.
  TORCH_ARG(int, rounds) = 0;
};

struct RaceEntry {
  Candidate candidate;
  double predicted_seconds = 0;
  std::vector<double> step_seconds;  // every timed step
  std::string error;                 // why building or running it failed ("" when it ran)
  int rounds = 0;                    // rounds it ran (it was dropped after the last, unless chosen)
  double measured_seconds() const;   // the median step; 0 when it failed
};

struct Race {
  std::vector<RaceEntry> finalists;  // in the ranking's order
  size_t best_index = 0;             // the fastest measured of the last round
  int rounds = 0;
  const Candidate& best() const { return finalists.at(best_index).candidate; }
  // One line per finalist: the plan, predicted and measured step, the chosen one marked.
  std::string str() const;
};

// The plans race_candidates races, as RaceOptions says: indices into
// search.ranked, in its order.
std::vector<size_t> pick_finalists(const SearchResult& search, const RaceOptions& tune = {});

// Races tune.finalists() plans of `search` (which searched `model` with
// `options`), chosen as RaceOptions says, on a batch of `inputs` and
// `targets` with `loss_fn` and returns them, the fastest measured of the
// last round chosen. Each finalist's pipeline is
// built from the model as Candidate::options(options) says and trained, its
// gradients cleared after every step; the model is then left as it was found:
// its weights, gradients, buffers and device placement, and the random
// generators' states. A finalist that fails to build or run is skipped, its
// error kept; when every one fails, throws the first finalist's error.
// Throws std::invalid_argument for an empty search or options out of range.
Race race_candidates(const torch::nn::Sequential& model, const SearchResult& search, const PipelineOptions& options,
                     const Tensors& inputs, const Tensors& targets, const TensorsLossFn& loss_fn,
                     const RaceOptions& tune = {});

}  // namespace conveyor
