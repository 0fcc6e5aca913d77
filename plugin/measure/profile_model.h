#pragma once
// profile_model: what each layer of a model costs (the planner's profile,
// plugin/planner/profile.h) and what the runtime itself costs per action,
// measured by running a pipeline of layers that do nothing.
//
//   auto profile = conveyor::profile_model(model, microbatch_input, microbatch_target, loss_fn);
//   std::cout << profile.str();

#include "plugin/core/options.h"
#include "plugin/planner/profile.h"
#include "plugin/core/types.h"

#include <c10/core/Device.h>
#include <torch/nn/modules/container/sequential.h>

namespace conveyor {

// Runs each layer of `model` on one micro-batch, forward and backward, as a
// stage would: everything in a ModelProfile but the runtime's own cost per
// action, which profile_model (below) adds by running a
// pipeline. Leaves the model as it found it (see profile_model).
ModelProfile profile_layers(const torch::nn::Sequential& model, const Tensors& inputs, const Tensors& targets,
                            const TensorsLossFn& loss_fn, const ProfileOptions& options = {});

// The link between two devices as the in-process transport uses it: a handoff
// between threads for the same device, a copy otherwise.
LinkProfile measure_link(const c10::Device& from, const c10::Device& to);

// Runs each layer of `model` on one micro-batch, forward and backward, as a
// stage would (the layer's input a leaf that gets a gradient, except the
// model's own inputs). Leaves the model as it found it: its gradients,
// buffers (batch-norm statistics) and the global random generator's state are
// restored; it is moved to options.device(). Throws std::invalid_argument for
// an empty model or batch, and the layer's error, named, if one fails.
ModelProfile profile_model(const torch::nn::Sequential& model, const Tensors& inputs, const Tensors& targets,
                           const TensorsLossFn& loss_fn, const ProfileOptions& options = {});
ModelProfile profile_model(const torch::nn::Sequential& model, const at::Tensor& input, const at::Tensor& target,
                           const LossFn& loss_fn, const ProfileOptions& options = {});

// The profile of `model` on the first micro-batch of a whole batch, split as
// a pipeline with `options` splits it (options.microbatches() parts along
// options.batch_dim(), shared inputs and targets whole), with the options'
// optimizer's step priced unless `profiling` names one: what balance "time"
// and the plan search take (PipelineOptions::profile).
ModelProfile profile_first_microbatch(const torch::nn::Sequential& model, const Tensors& inputs,
                                      const Tensors& targets, const TensorsLossFn& loss_fn,
                                      const PipelineOptions& options, ProfileOptions profiling = {});
ModelProfile profile_first_microbatch(const torch::nn::Sequential& model, const at::Tensor& input,
                                      const at::Tensor& target, const LossFn& loss_fn, const PipelineOptions& options,
                                      ProfileOptions profiling = {});

// The runtime's time per action on `device`: a two-stage GPipe step of layers
// that do nothing, 8 micro-batches, the median of a few steps over the
// 2 (M + K - 1) actions on its critical path.
double measure_action_overhead(const c10::Device& device);

// The runtime's time per action when the workers outnumber `profile`'s cores
// (ModelProfile::crowded_action_overhead_seconds): a 1F1B step of cores + 2
// workers, each computing Linear layers, measured, and the overhead per
// action that makes the planner's prediction from `profile`'s slowdown meet
// it (at least action_overhead_seconds). Needs profile.cores and slowdown.
double measure_crowded_overhead(const ModelProfile& profile);

}  // namespace conveyor
