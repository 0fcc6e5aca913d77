#pragma once
// The model's layers run in order, as a stage runs them: one micro-batch
// forward through every layer and the loss, and back. A layer timed alone,
// over and over, finds its weights in the cache; run in order it loads them
// after the other layers' (on this CPU the in-order pass of an MLP with
// 1 MiB layers took 15-20 % longer than the sum of its layers timed alone).

#include "plugin/model/stage.h"
#include "plugin/core/types.h"

#include <c10/core/Device.h>

#include <memory>
#include <vector>

namespace conveyor::measure_detail {

// One micro-batch through every layer and the loss, and back to the weights
// (gradients returned, not accumulated: several threads may run it at once).
void whole_step(const std::vector<std::shared_ptr<Stage>>& layers, const Tensors& inputs, const Tensors& targets,
                const TensorsLossFn& loss_fn);

struct InOrderTimes {
  std::vector<double> forward;  // per layer, timed within the forward pass
  double backward = 0;          // the whole backward, the loss's included
};

// Median times of `repeats` in-order passes after `warmup` (weight gradients
// accumulate: the caller restores them).
InOrderTimes time_in_order(const std::vector<std::shared_ptr<Stage>>& layers, const Tensors& inputs,
                           const Tensors& targets, const TensorsLossFn& loss_fn, const c10::Device& device, int warmup,
                           int repeats);

}  // namespace conveyor::measure_detail
