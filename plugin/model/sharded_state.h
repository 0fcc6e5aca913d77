#pragma once
// An optimizer whose state is split across processes: the replicas' shards
// of a ShardedOptimizer (plugin/distributed/sharded_optimizer.h). A
// checkpoint saves each process's part as it is, flat pieces of the weights
// (no process gathers the whole state); a checkpoint's whole state, or the
// parts of all replicas merged, loads at any number of replicas
// (plugin/checkpoint/checkpoint.h).

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

namespace conveyor {

class ShardedState {
 public:
  virtual ~ShardedState() = default;
  // This process's index among the replicas that split the state, and their number.
  virtual int replica() const = 0;
  virtual int replicas() const = 0;
  // The optimizer over this process's pieces: of each weight of n elements,
  // elements [replica() * p, replica() * p + p) of the flattened weight, with
  // p = ceil(n / replicas()), zero past n.
  virtual torch::optim::Optimizer& shard() = 0;
  // The weight whose piece `piece` (one of shard()'s tensors) is; throws
  // std::invalid_argument for another tensor.
  virtual const at::Tensor& weight_of_piece(const at::Tensor& piece) const = 0;
  // An optimizer of the same kind over the whole weights, with the same
  // groups and options and no state: what a whole state is restored into
  // before take_shard. Local.
  virtual std::unique_ptr<torch::optim::Optimizer> whole_without_state() const = 0;
  // Takes this process's part of `whole`'s state (and its learning rates).
  // Local.
  virtual void take_shard(const torch::optim::Optimizer& whole) = 0;
  // After shard()'s state and learning rates were restored directly: the
  // learning rates become this optimizer's (which it hands the pieces' at
  // each step).
  virtual void shard_restored() = 0;
  // Where the gradients are sharded too: this process's pieces of every
  // weight, in the weights' order (those of frozen weights, which shard()
  // does not step, included), whose .grad hold its pieces of the reduced
  // gradients (what the loss scaler's verdict, unscaling and clipping read
  // and change); else null, and the whole weights' .grad hold them.
  virtual const std::vector<at::Tensor>* gradient_pieces() const { return nullptr; }

  // Where the parameters are sharded too (shard "parameters", ZeRO-3): the
  // pieces are the weights' values, and the weights keep their shapes but
  // hold no storage outside the spans the schedule gathers them for.
  virtual bool shards_parameters() const { return false; }
  // Whether the weights hold their storage now (gathered, or not sharded).
  virtual bool parameters_whole() const { return true; }
  // Fills the weights' storage again, in place, with every replica's pieces
  // (what autograd saved of the weights reads the gathered values).
  // Collective over the replicas.
  virtual void gather_parameters() {}
  // Releases the weights' storage (their pieces stay). Local; idempotent.
  virtual void release_parameters() {}
  // Gives the weights storage again without filling it (to be written whole,
  // then taken by shard_parameters). Local.
  virtual void allocate_parameters() {}
  // The whole weights as they are now (broadcast, loaded) become this
  // replica's pieces, and their storage is released. Local.
  virtual void shard_parameters() {}
};

// The sharded parameters of `runner`'s local stages (a StageRunner's or a
// Runtime's), in stage order: what gathers or releases them all goes through.
template <typename Runner>
std::vector<ShardedState*> local_parameter_shards(const Runner& runner) {
  std::vector<ShardedState*> shards;
  for (int k = 0; k < runner.num_stages(); ++k) {
    if (ShardedState* s = runner.is_local(k) ? runner.stage(k).parameter_shards() : nullptr) shards.push_back(s);
  }
  return shards;
}

}  // namespace conveyor
