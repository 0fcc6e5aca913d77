#pragma once
// What the examples share to plan a pipeline: split it as --balance asks, and report the prediction next to
// what a step measured (and draw both with --timeline).

#include "plugin/conveyor.h"

#include <memory>
#include <ostream>
#include <string>
#include <vector>

namespace conveyor::examples {

// The names --balance takes: "time" (measured, the default), "uniform" (layer
// counts), "flops" (the example's own cost estimate, `estimate`).
const std::vector<std::string>& balance_names();

// Sets options' partition for `balance`; throws std::invalid_argument for an unknown name.
void apply_balance(const std::string& balance, const std::vector<double>& estimate, int stages,
                   PipelineOptions& options);

// A training batch to time plans on (--plan tuned).
struct TuningBatch {
  Tensors inputs, targets;
  TensorsLossFn loss;
};

// The names --plan takes: "given" (the other flags decide), "auto" and "tuned".
// --plan auto searches the whole plan (plugin/planner/search.h) for `model`
// and a batch of `batch` samples, within `max_workers` workers and
// `memory_budget_mib` MiB per worker (0: any), prints the search to `out` and
// returns `options` with the fastest predicted plan's choices; --plan tuned
// then times the first six plans on `tuning` (plugin/tune_plan.h) and takes
// the fastest measured; "given" returns `options` as they are. Throws
// std::invalid_argument for another name, for tuned without a batch, or for
// auto with an asynchronous schedule in `options` (the search takes
// synchronous schedules only; their optimizer, if any, is kept).
PipelineOptions plan_options(const std::string& plan, const torch::nn::Sequential& model, int64_t batch,
                             int max_workers, int64_t memory_budget_mib, PipelineOptions options, std::ostream& out,
                             const TuningBatch* tuning = nullptr);

// "predicted vs measured" for the step, and the timeline (predicted above
// measured) written to `timeline` when not empty.
void report_step(std::ostream& out, const Plan& plan, const StepResult& step, const std::string& timeline);

}  // namespace conveyor::examples
