#pragma once
// The planner's synthesised schedules: for a plan's split and predicted costs,
// a schedule built by schedules::synthesise() (schedules/synthesise.h) under
// the per-worker memory budget, priced as any other plan. Where the stages are
// uneven (a slow or memory-heavy last stage) or the budget lies between what
// two fixed families need, it finds orders no fixed family has.

#include "plugin/core/options.h"
#include "plugin/planner/planner.h"

#include <torch/nn/modules/container/sequential.h>

#include <cstdint>

namespace conveyor {

// The name such a plan's schedule carries.
inline constexpr const char* kSynthesisedSchedule = "synthesised";

// `priced`: a plan of the workers, chunks (1, or 2 in a V) and micro-batches
// wanted, whose split and per-stage costs (forward, I, W, transfers) and
// activation bytes the synthesis takes. `memory_budget`: bytes per worker (0:
// none); the weights and optimizer state of a worker's stages come off it
// first. Returns the plan of the same split under the synthesised schedule
// (its text travels as PipelineOptions::schedule_text). Throws
// std::invalid_argument when no schedule fits the budget.
Prediction predict_synthesised(const torch::nn::Sequential& model, const PipelineOptions& options, const Prediction& priced,
                      int64_t batch, int64_t memory_budget);

}  // namespace conveyor
