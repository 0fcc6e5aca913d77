#pragma once
// BuildOptions: how a model given from Python (or TorchScript) becomes a
// pipeline: where to cut it, whether to search the plan, what to swap in,
// and the pipeline's own optimizer by name. Rows as in plugin/option_list.h;
// the builder reads them with PipelineOptions' and DistributedOptions'.

#include "plugin/option_list.h"

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace conveyor {

// Whether the plan is the options' (given), searched on the profile of a
// sample batch (auto), or searched and then raced on it (tuned).
enum class PlanMode { kGiven, kAuto, kTuned };
constexpr std::array<const char*, 3> value_names(PlanMode) { return {"given", "auto", "tuned"}; }

// The optimizers the pipeline can make by name (torch.optim's).
enum class OptimizerName { kSgd, kAdam, kAdamW };
constexpr std::array<const char*, 3> value_names(OptimizerName) { return {"sgd", "adam", "adamw"}; }

#define CONVEYOR_BUILD_OPTIONS(X)                                                                                  \
  X(cutting, std::vector<std::string>, split_points, {}, kAny,                                                     \
    "Submodule names whose calls begin a new stage ([\"layers.2\", \"head\"]: three stages). Without them the "    \
    "forward must be a plain chain of submodules, cut into workers stages by balance.")                            \
  X(planning, PlanMode, plan, PlanMode::kGiven, kAny,                                                          \
    "\"given\": the plan the options describe. \"auto\": search the whole plan (workers, schedule, chunks, "       \
    "micro-batches, recomputation, split) on the profile of sample for the fastest predicted step within "         \
    "max_workers and memory_budget. \"tuned\": then race the twelve predicted fastest on sample, the slower "      \
    "half dropped each round.")                                                                                    \
  X(planning, int, max_workers, 0, at_least(0), "Plan \"auto\": the most workers to consider (0: workers, else 4).") \
  X(planning, int64_t, memory_budget, 0, at_least(0),                                                              \
    "Plan \"auto\": bytes each worker may hold (0: no limit).")                                                    \
  X(model, bool, fused_ops, false, kAny,                                                                           \
    "Swap Conveyor's fused LSTM into the model (a TorchScript module or torch::nn layers) before cutting it.")     \
  X(model, bool, optimize, false, kAny, "Let the TorchScript executor optimize the stages.")                       \
  X(training, std::optional<OptimizerName>, optimizer, std::nullopt, kAny,                                         \
    "The pipeline's own optimizer by name (torch.optim's), one per stage; train_step steps it.")                  \
  X(training, std::optional<double>, lr, std::nullopt, kAny, "The learning rate of the pipeline's optimizer.")    \
  X(training, std::optional<double>, momentum, std::nullopt, kAny, "Momentum (\"sgd\" only).")                     \
  X(training, std::optional<double>, weight_decay, std::nullopt, kAny,                                             \
    "Weight decay (torch.optim's default: 0, and 0.01 for \"adamw\").")

struct BuildOptions {
  CONVEYOR_BUILD_OPTIONS(CONVEYOR_OPTION_ARG)
};
CONVEYOR_FOR_EACH_OPTION(BuildOptions, CONVEYOR_BUILD_OPTIONS)

// The factory BuildOptions' optimizer, lr, momentum and weight_decay
// describe (null without an optimizer); std::invalid_argument for a
// combination that names no optimizer.
OptimizerFactory optimizer_from(const BuildOptions& options);

}  // namespace conveyor
