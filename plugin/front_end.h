#pragma once
// What the front ends (TorchScript, plugin/script/; torch.export programs,
// plugin/export/) share once they have turned a model into a Sequential of
// layers: split points made into the stages' boundaries, tied parameters
// named as the layers name them, and the profile that balancing by time needs.

#include "plugin/options.h"
#include "plugin/types.h"

#include <torch/nn/modules/container/sequential.h>

#include <string>
#include <vector>

namespace conveyor {

// A sample batch for balance by time: its first micro-batch is profiled
// (plugin/profile_model.h).
struct ProfileBatch {
  Tensors inputs, targets;
  TensorsLossFn loss;
};

// The layers a front end made and the options a Pipeline (or a
// DistributedPipeline) is built from.
struct FrontEndStages {
  torch::nn::Sequential layers;
  PipelineOptions options;
};

// {1, 2, ..., n}: each of a front end's n + 1 segments one stage.
std::vector<int64_t> split_point_boundaries(const std::vector<std::string>& split_points);

// Checks that the options agree with `split_points` (workers 0 or one per
// segment, no boundaries of their own) and sets the boundaries; nothing
// without split points.
void apply_split_points(PipelineOptions& options, const std::vector<std::string>& split_points);

// "emb.weight" in the model -> "stage0.emb.weight" among the layers (each a
// ModelPath, plugin/model_names.h). Throws std::invalid_argument for a name no
// layer holds.
std::string layer_parameter_name(const torch::nn::Sequential& layers, const std::string& model_name);

// Adds `tied_parameters` (groups of the model's names) to the options' ties;
// with Balance::kTime and no profile, profiles the first micro-batch of
// `profile_batch` (required then) and writes the plan with its predictions
// to `plan_text` (if given).
FrontEndStages front_end_stages(torch::nn::Sequential layers, PipelineOptions options,
                                const std::vector<std::vector<std::string>>& tied_parameters,
                                const ProfileBatch* profile_batch, std::string* plan_text);

}  // namespace conveyor
