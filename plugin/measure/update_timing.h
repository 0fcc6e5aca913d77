#pragma once
// The runtime's bookkeeping around an update of a layer's weights, timed for
// the profile (LayerProfile::update_seconds, check_seconds, copy_seconds):
// the optimizer's step, the divergence guard's check of the gradients, a
// copy of the weights. On a CPU each timing starts with the core's own cache
// written over, as in a step, where other work ran in between.

#include "plugin/planner/profile.h"

#include <c10/core/Device.h>
#include <torch/nn/modules/container/any.h>

namespace conveyor::measure_detail {

// Fills out's update_seconds (when the options give an optimizer),
// check_seconds and copy_seconds from copies of `layer`'s trainable weights,
// each with a gradient of ones; leaves them 0 for a layer without weights.
void time_updates(const torch::nn::AnyModule& layer, const ProfileOptions& o, const c10::Device& device,
                  LayerProfile& out);

}  // namespace conveyor::measure_detail
