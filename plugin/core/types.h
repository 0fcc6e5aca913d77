#pragma once
// The types the public headers share: what crosses a stage boundary, the loss
// functions a step takes, and the runs of layers a partition keeps together.

#include "ops/adapters.h"  // Tensors: a list of tensors, a slot each

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace conveyor {

// Returns the loss of one micro-batch: a scalar (see LossReduction).
using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;
// The same for a model of several outputs or targets: the last stage's
// outputs and the micro-batch's targets.
using TensorsLossFn = std::function<at::Tensor(const Tensors& outputs, const Tensors& targets)>;

// Layers first..last (inclusive) form one unit no boundary may cut (a residual
// block, an encoder layer).
struct AtomicGroup {
  int64_t first = 0;
  int64_t last = 0;
};

// Where a dynamic loss scaler stands (PipelineOptions::loss_scaling): the
// scale the next step's loss is multiplied by, and the clean updates in a row
// since the scale last changed. Checkpoints carry it.
struct LossScalerState {
  double scale = 65536.0;
  int64_t growth_tracker = 0;
};

// How a stage's gradients are shared with its data-parallel replicas before
// an update (the distributed pipeline's; plugin/distributed/distributed_runner.h).
struct ReplicaReduction {
  // Starts reducing stage `stage`'s gradients (the .grad of `weights`) across
  // the replicas, reading them now; the function returned waits for the
  // reduction and writes the reduced gradients into the .grad of `holders`
  // (Stage::gradient_holders: `weights` themselves, or, with the gradients
  // sharded, this replica's pieces of them, which accumulate while the
  // weights' .grad are released as soon as they are read), and must be
  // called before anything else writes them (or reads them as reduced). The
  // runtime starts it where the schedule's REDUCE_GRAD for the stage stands
  // (after its last backward of the step, or after each with the gradients
  // sharded), so that it runs while the worker goes on.
  std::function<std::function<void()>(int stage, const std::vector<at::Tensor>& weights,
                                      const std::vector<at::Tensor>& holders)>
      start;
  // Set when the reduction leaves each replica only its shard of the reduced
  // gradients (zeros elsewhere, or pieces; sharded optimizer state): sums `values` (their
  // maximum, with `max`) across the replicas, so that the loss scaler's
  // verdict and the clipping norm are the whole gradients'.
  std::function<void(at::Tensor& values, bool max)> across_replicas;
  // Set when `start` releases the whole gradients as it reads them and the
  // holders accumulate (the gradients sharded): a stage may reduce after each
  // backward, and its next backward first waits for that reduction, whose
  // buffers hold a whole gradient's worth.
  bool accumulates = false;

  // start, then wait.
  void gradients(int stage, const std::vector<at::Tensor>& weights, const std::vector<at::Tensor>& holders) const {
    start(stage, weights, holders)();
  }
  explicit operator bool() const { return static_cast<bool>(start); }
};

}  // namespace conveyor
