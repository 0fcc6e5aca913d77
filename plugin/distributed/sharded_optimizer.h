#pragma once
// Optimizer state, and with it the gradients and the parameters, sharded
// across the data-parallel replicas of a stage (ZeRO stages 1, 2 and 3; the
// option shard, levels "optimizer", "gradients" and "parameters").
//
// Each of the stage's D replicas keeps the optimizer state of 1/D of every
// weight: a weight of n elements is cut into D pieces of ceil(n / D) (the
// last padded with zeros), and replica d updates piece d. A step then goes:
//  1. start_reduce_scatter_gradients: the replicas' gradients are summed (or
//     averaged) by a reduce-scatter, so that each replica receives only its
//     pieces of the reduced gradient; they are written into the weights'
//     gradients, whose other elements are set to zero. What looks at the
//     gradients before the update (the loss scaler's verdict, unscaling,
//     clipping by global norm) works on those, and sums its verdict and its
//     norm across the replicas as well (ReplicaReduction::across_replicas);
//  2. ShardedOptimizer::step: the wrapped optimizer steps the pieces;
//  3. the updated pieces are all-gathered into every replica's weights.
// At "gradients" (ZeRO-2) step 1 is start_reduce_scatter_into_pieces
// instead: the whole gradients are released as the reduce-scatter reads them,
// and each replica's pieces of the reduced gradients are the .grad of the
// optimizer's pieces (ShardedState::gradient_pieces), accumulating over the
// reductions of a step (one a step, or one after each micro-batch's
// backward), which is all the gradient storage a replica keeps past a
// micro-batch; the verdict, unscaling and clipping work on those.
// At "parameters" (ZeRO-3) the pieces are also the weights' only values: the
// weights keep their shapes, but their storage is released outside the spans
// where the schedule gathers them (UNSHARD to RESHARD, schedules/sharding.h),
// and refilled in place when gathered, so that what autograd saved of them
// between a forward and its backward reads the gathered values. The update
// steps the pieces and gathers nothing (step 3 is the next UNSHARD's).
// Per element this is the update an unsharded replica makes, for optimizers
// whose update is elementwise (SGD, Adam, AdamW, Adagrad, RMSprop, the only
// ones accepted), so the weights equal the unsharded hybrid's.
//
// Checkpoints (ShardedState): each replica saves its own pieces' state, with
// no collective; a file loads into the same replica of the same layout, and
// the files of all replicas merged give the whole state, which loads at any
// number of replicas (plugin/checkpoint/checkpoint.h).

#include "plugin/distributed/process_groups.h"
#include "plugin/model/sharded_state.h"
#include "plugin/core/options.h"

#include <c10/core/Storage.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace conveyor {

// How every weight of a stage is cut among D replicas.
struct ShardLayout {
  // `weights` in order; D = replicas; this replica's index.
  ShardLayout(const std::vector<at::Tensor>& weights, int replicas, int replica);
  int replicas = 1;
  int replica = 0;
  std::vector<int64_t> numel;  // per weight
  std::vector<int64_t> piece;  // per weight: ceil(numel / D)

  // Elements of weight i in this replica's piece (the rest is padding).
  int64_t owned(size_t i) const;
  // This replica's piece of `t` (weight i's shape, or flat), a copy padded to piece[i].
  at::Tensor piece_of(size_t i, const at::Tensor& t) const;
};

// Starts summing (averaging) the stage's gradients across its replicas with
// a reduce-scatter, reading them now: once the pending collective is called,
// each weight's gradient holds this replica's piece of the reduced gradient,
// zeros elsewhere. A weight without a gradient contributes zeros. Collective
// over the replicas; `stage` names the stage in errors.
PendingCollective start_reduce_scatter_gradients(ProcessGroups& groups, int stage,
                                                 const std::vector<at::Tensor>& weights, bool average);

// The same reduce-scatter for sharded gradients (ZeRO-2): reads the weights'
// gradients and releases them; once the pending collective is called, each of
// `pieces` (ShardedOptimizer::pieces(), one per weight) has this replica's
// piece of the reduced gradient added to its .grad (set, if it has none).
PendingCollective start_reduce_scatter_into_pieces(ProcessGroups& groups, int stage,
                                                   const std::vector<at::Tensor>& weights,
                                                   const std::vector<at::Tensor>& pieces, bool average);

class ShardedOptimizer final : public torch::optim::Optimizer, public ShardedState {
 public:
  // `factory`'s optimizer (SGD, Adam, AdamW, Adagrad or RMSprop; anything
  // else is refused naming it), remade over this replica's pieces of
  // `weights` with the same parameter groups and options, which it copies to
  // them at each step (a learning-rate schedule sets this optimizer's).
  // `level`: kOptimizer; kGradients, where the pieces hold the gradients;
  // kParameters, where they are the weights' values too (the weights stay
  // whole until shard_parameters, after the replicas' weights are made equal).
  ShardedOptimizer(std::vector<at::Tensor> weights, const OptimizerFactory& factory,
                   std::shared_ptr<ProcessGroups> groups, ShardLevel level);

  // The pieces' step from the gradients start_reduce_scatter_gradients left
  // (at kGradients and kParameters: the pieces' own, released after), then,
  // below kParameters, the weights all-gathered across the replicas
  // (collective).
  at::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override { inner_->save(archive); }
  void load(torch::serialize::InputArchive& archive) override { inner_->load(archive); }
  int replica() const override { return layout_.replica; }
  int replicas() const override { return layout_.replicas; }
  torch::optim::Optimizer& shard() override { return *inner_; }
  const at::Tensor& weight_of_piece(const at::Tensor& piece) const override;
  std::unique_ptr<torch::optim::Optimizer> whole_without_state() const override;
  void take_shard(const torch::optim::Optimizer& whole) override;
  void shard_restored() override;
  const std::vector<at::Tensor>* gradient_pieces() const override {
    return level_ >= ShardLevel::kGradients ? &pieces_ : nullptr;
  }
  bool shards_parameters() const override { return level_ == ShardLevel::kParameters; }
  bool parameters_whole() const override;
  void gather_parameters() override;
  void release_parameters() override;
  void allocate_parameters() override;
  void shard_parameters() override;

  // The optimizer over this replica's pieces.
  torch::optim::Optimizer& inner() { return *inner_; }
  const torch::optim::Optimizer& inner() const { return *inner_; }
  const ShardLayout& layout() const { return layout_; }
  // The stage's weights, in the order of layout().
  const std::vector<at::Tensor>& weights() const { return weights_; }
  // The pieces, in the order of layout().
  const std::vector<at::Tensor>& pieces() const { return pieces_; }

 private:
  ShardedOptimizer(std::vector<at::Tensor> weights, std::unique_ptr<torch::optim::Optimizer> full,
                   std::shared_ptr<ProcessGroups> groups, ShardLevel level);

  std::vector<at::Tensor> weights_;
  ShardLevel level_;
  ShardLayout layout_;
  std::shared_ptr<ProcessGroups> groups_;
  std::vector<at::Tensor> pieces_;  // per weight: this replica's piece, what inner_ steps
  // kParameters: each storage the weights use (several weights may be views
  // of one) and its bytes when whole.
  struct Storage {
    c10::Storage impl;
    size_t nbytes = 0;
  };
  std::vector<Storage> storages_;

  // Every replica's pieces into this replica's weights (at kParameters, into
  // their storage, refilled, without a new version). Collective; `what`
  // begins the collective's description.
  void gather_into_weights(const char* what);
  std::unique_ptr<torch::optim::Optimizer> inner_;
};

// Bytes of the tensors in an optimizer's state (momentum, moments, ...): for
// a ShardedOptimizer, this replica's pieces'. 0 before the first step of the
// optimizers that make their state then. SGD, Adam, AdamW, Adagrad, RMSprop;
// throws std::invalid_argument for another optimizer.
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace conveyor
