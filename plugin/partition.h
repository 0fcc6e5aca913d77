#pragma once
// Partitioning: which layers of a torch::nn::Sequential each stage runs and on
// which device. Pure: decides, never moves or runs anything.

#include "plugin/options.h"
#include "schedules/schedule.h"

#include <c10/core/Device.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <string>
#include <vector>

namespace conveyor {

struct StageSpec {
  int64_t begin = 0;  // first layer (index into the Sequential)
  int64_t end = 0;    // one past the last layer
  c10::Device device = c10::Device(c10::kCPU);
};

struct StagePlan {
  int64_t num_layers = 0;
  std::vector<StageSpec> stages;
  std::string str() const;  // "stage 0: layers [0, 3) on cpu; stage 1: ..."
};

// K-1 split points giving every stage floor(L/K) layers, the first L%K one more.
std::vector<int64_t> uniform_boundaries(int64_t num_layers, int num_stages);

// K-1 split points of contiguous stages minimising the largest stage's total
// cost (the classic linear partition); ties go to the earliest split.
std::vector<int64_t> balanced_boundaries(const std::vector<double>& layer_costs, int num_stages);

// Throws std::invalid_argument unless `boundaries` are strictly increasing and
// each lies in (0, num_layers).
void check_boundaries(const std::vector<int64_t>& boundaries, int64_t num_layers);

// One device per stage from PipelineOptions::devices; throws
// std::invalid_argument naming the stage for an unknown or absent device.
std::vector<c10::Device> stage_devices(const std::vector<std::string>& names, int num_stages);

// The whole decision for a model and its options; throws std::invalid_argument.
// Balance::kTime needs options.profile() of this model (plugin/planner.h).
StagePlan plan_stages(const torch::nn::Sequential& model, const PipelineOptions& options);

// The validated schedule a pipeline with these options runs on num_stages
// stages (schedule() or schedule_text()); throws std::invalid_argument.
schedules::Schedule build_schedule(const PipelineOptions& options, int num_stages);

}  // namespace conveyor
