#pragma once
// The baselines a distributed pipeline is measured against: the same work
// without a pipeline, by data parallelism over c10d and by LibTorch's own
// DataParallel.

#include "plugin/distributed/process_groups.h"
#include "plugin/core/types.h"

#include <c10/core/Device.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

namespace conveyor {

// Data parallelism over c10d: every rank holds the whole model and trains it
// on its shard; gradients are averaged over all ranks (with one worker, the
// replicas group is the world) before each step.
// Use a layout with one stage (HybridLayout::for_world(world, 1)).
class AllReduceDataParallel {
 public:
  AllReduceDataParallel(torch::nn::Sequential model, std::unique_ptr<torch::optim::Optimizer> optimizer,
                        std::shared_ptr<ProcessGroups> groups);
  // Forward, backward, all-reduce, step; returns the global loss (mean over ranks).
  double train_step(const at::Tensor& input, const at::Tensor& target, const LossFn& loss_fn);
  bool is_logging_rank() const { return groups_->rank() == 0; }

 private:
  torch::nn::Sequential model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::shared_ptr<ProcessGroups> groups_;
};

// LibTorch's own DataParallel (torch::nn::parallel::data_parallel) in one
// process: replicates the model on `devices`, splits the batch, gathers the
// output on devices[0]; one step of `optimizer`. On the CPU only one device
// exists, so it runs the model once, unsplit. Returns the loss.
double data_parallel_step(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer, const at::Tensor& input,
                          const at::Tensor& target, const LossFn& loss_fn, const std::vector<c10::Device>& devices);

}  // namespace conveyor
