#pragma once
// An optimizer whose state is split across processes: the replicas' shards
// of a ShardedOptimizer (plugin/distributed/sharded_optimizer.h). Checkpoints
// save and load such state whole, so that a file does not depend on how it
// was split (plugin/checkpoint/checkpoint.h).

#include <torch/optim/optimizer.h>

#include <memory>

namespace conveyor {

class ShardedState {
 public:
  virtual ~ShardedState() = default;
  // An optimizer of the same kind over the whole weights, holding the whole
  // state, gathered from every process that holds a part. Collective.
  virtual std::unique_ptr<torch::optim::Optimizer> gather_state() = 0;
  // Takes this process's part of `whole`'s state (an optimizer that
  // gather_state() made, over the same weights). Local.
  virtual void take_shard(const torch::optim::Optimizer& whole) = 0;
};

}  // namespace conveyor
