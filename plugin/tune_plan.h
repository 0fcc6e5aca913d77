#pragma once
// Choosing among the planner's best plans by running them. The search
// (plugin/planner/search.h) ranks every plan by its predicted step; on a CPU
// shared by the workers a prediction misses by 5-25 % (benchmarks/results/
// choice.md), more than separates the first few of the ranking. tune_plan
// builds those few on the model, times some training steps of each on the
// real batch, the finalists taking turns, and returns the fastest measured,
// with every finalist's prediction and measurement. It costs
// finalists x rounds x (steps + 1) training steps before the run.
//
//   const conveyor::PlanSearch search = conveyor::search_plans(model, options, batch, space);
//   const conveyor::PlanTuning tuning = conveyor::tune_plan(model, search, options, {x}, {y}, loss);
//   std::cout << tuning.str();
//   conveyor::Pipeline pipe(model, tuning.best().options(options));

#include "plugin/options.h"
#include "plugin/planner/search.h"
#include "plugin/types.h"

#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>

#include <string>
#include <vector>

namespace conveyor {

struct TuneOptions {
  // The first this many plans of the search's ranking (fewer if it has fewer).
  TORCH_ARG(int, finalists) = 6;
  // Per round, each finalist is built, runs one step to warm up, then this
  // many timed steps; the rounds take the finalists in turn, forwards then
  // backwards, so that a machine slowing down or speeding up favours none.
  TORCH_ARG(int, steps) = 2;
  TORCH_ARG(int, rounds) = 2;
};

struct TunedPlan {
  PlanChoice choice;
  double predicted_seconds = 0;
  std::vector<double> step_seconds;  // every timed step
  std::string error;                 // why building or running it failed ("" when it ran)
  double measured_seconds() const;   // the median step; 0 when it failed
};

struct PlanTuning {
  std::vector<TunedPlan> finalists;  // in the ranking's order
  size_t best_index = 0;             // the fastest measured
  const PlanChoice& best() const { return finalists.at(best_index).choice; }
  // One line per finalist: the plan, predicted and measured step, the chosen one marked.
  std::string str() const;
};

// Measures the first options.finalists() plans of `search` (which searched
// `model` with `options`) on a batch of `inputs` and `targets` with `loss_fn`
// and returns them, the fastest measured chosen. Each finalist's pipeline is
// built from the model as PlanChoice::options(options) says and trained, its
// gradients cleared after every step; the model is then left as it was found:
// its weights, gradients, buffers and device placement, and the random
// generators' states. A finalist that fails to build or run is skipped, its
// error kept; when every one fails, throws the first finalist's error.
// Throws std::invalid_argument for an empty search or non-positive options.
PlanTuning tune_plan(const torch::nn::Sequential& model, const PlanSearch& search, const PipelineOptions& options,
                     const Tensors& inputs, const Tensors& targets, const TensorsLossFn& loss_fn,
                     const TuneOptions& tune = {});

}  // namespace conveyor
