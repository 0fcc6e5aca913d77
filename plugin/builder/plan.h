#pragma once
// The builder's second phase (plugin/pipeline.h): the plan, chosen as
// the option plan says, on the layers the front end made.
//   given  the options' own plan; balance "time" profiles the first
//          micro-batch of the sample for it, once, here.
//   auto   the whole plan searched (plugin/planner/search.h) on that
//          profile, within max_workers and memory_budget.
//   tuned  the search's finalists raced on the sample
//          (plugin/measure/race_candidates.h) and the fastest measured taken.

#include "plugin/core/options.h"
#include "plugin/core/types.h"

#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <string>

namespace conveyor {

// A whole batch, as a step takes it: its first micro-batch is what the
// profile measures.
struct SampleBatch {
  Tensors inputs, targets;
};

// The sample's size along the options' batch_dim (its first input split into
// micro-batches; 0 without one).
int64_t batch_size(const SampleBatch& sample, const PipelineOptions& options);

// A decided plan: what a pipeline is built from.
struct Plan {
  PipelineOptions options;  // with the plan's choices, and the profile if one was taken
  std::string search;       // plan auto's search (and "tuned: " and its race), as text; empty for given
};

// What the plan is chosen on besides the layers and options.
struct PlanInputs {
  const SampleBatch* sample = nullptr;  // profiled (balance "time", auto) and raced (tuned); null: none
  TensorsLossFn loss;                   // what the profile and the race run
  int64_t batch_size = 0;               // the step's batch (auto's search); 0: the sample's
  bool across_processes = false;        // the options are one process's of several
  bool checked = false;                 // check_plan_mode has passed them (check_request): decide_plan does not again
};

// How often requests were parsed (request_from_dict), checked
// (check_request), their plans checked (check_plan_mode) and their options
// checked against the model's kind (check_model_kind) in this process: a
// pipeline's construction and build do each once.
struct RequestCounts {
  int64_t parses = 0, checks = 0, plan_checks = 0, kind_checks = 0;
};
RequestCounts request_counts();
enum class RequestStage { kParse, kCheck, kPlanCheck, kKindCheck };
void count_request(RequestStage stage);

// What a plan mode needs, checked before the model is read: plan "auto" and
// "tuned" a sample (tuned a loss too), no split points, one process, a
// synchronous schedule; plan "given" no search bounds, and across processes
// no balance "time" that each process would measure for itself (a given
// profile is the same everywhere). Throws
// std::invalid_argument saying what is missing. decide_plan checks first,
// unless the inputs say it was.
void check_plan_mode(const PipelineOptions& options, const PlanInputs& inputs);

// The plan, decided as the option plan says: given, searched (auto) or
// searched and raced (tuned). Options that hold a profile already are
// not profiled again (a caller may profile a micro-batch of its own). Throws
// std::invalid_argument for what the mode needs and lacks: a profile or a
// sample to take it from (balance "time", auto), a batch size (auto), a
// sample and a loss (tuned), no split points or boundaries (auto and tuned
// choose where to cut), one process (auto and tuned: each process would
// measure and choose its own), a synchronous schedule (auto and tuned search
// those), or search bounds with plan given.
Plan decide_plan(const torch::nn::Sequential& layers, PipelineOptions options, const PlanInputs& inputs);

}  // namespace conveyor
