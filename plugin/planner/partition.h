#pragma once
// Partitioning: which layers of a torch::nn::Sequential each stage runs and on
// which device. Pure: decides, never moves or runs anything.

#include "plugin/model/stage_split.h"
#include "plugin/core/options.h"
#include "schedules/schedule.h"

#include <c10/core/Device.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <string>
#include <vector>

namespace conveyor {

// K-1 split points giving every stage floor(L/K) layers, the first L%K one more.
std::vector<int64_t> uniform_boundaries(int64_t num_layers, int num_stages);

// K-1 split points of contiguous stages minimising the largest stage's total
// cost (the classic linear partition); ties go to the earliest split.
std::vector<int64_t> balanced_boundaries(const std::vector<double>& layer_costs, int num_stages);

// Throws std::invalid_argument unless `boundaries` are strictly increasing and
// each lies in (0, num_layers).
void check_boundaries(const std::vector<int64_t>& boundaries, int64_t num_layers);

// Stages per worker: options.chunks(), or the schedule's own (2 for the
// interleaved ones, 1 for the others) when it is 0.
int chunks_per_worker(const PipelineOptions& options);

// One device per worker from PipelineOptions::devices; throws
// std::invalid_argument naming the worker for an unknown or absent device.
std::vector<c10::Device> worker_devices(const std::vector<std::string>& names, int num_workers);

// The whole decision for a model and its options, which are within their
// rows' bounds (check_option_values checks them); throws std::invalid_argument.
// Balance::kTime needs options.profile() of this model (plugin/planner/planner.h).
// The schedule it places the stages by is build_schedule's; `schedule`, if
// given, receives it (so a pipeline builds and validates it once).
StageSplit split_stages(const torch::nn::Sequential& model, const PipelineOptions& options,
                      schedules::Schedule* schedule = nullptr);

// The capacity the stage-to-stage channels get: PipelineOptions::
// channel_capacity, raised for eager-1f1b to its lookahead + 1 so that the
// forwards it runs ahead never wait on a full channel (their tensors are
// stashed by the sender anyway: the deeper channel holds no extra memory).
int channel_capacity_for(const PipelineOptions& options);

// The validated schedule a pipeline with these options runs on num_stages
// stages (schedule() or schedule_text()); throws std::invalid_argument.
schedules::Schedule build_schedule(const PipelineOptions& options, int num_stages);

}  // namespace conveyor
