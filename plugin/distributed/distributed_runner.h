#pragma once
// DistributedRunner: this process's part of a pipeline across processes, one
// worker a process (running one stage, or several under an interleaved or V
// schedule), with D data-parallel replicas of the pipeline (hybrid
// parallelism); conveyor::Pipeline builds one when given process groups. The
// data-parallel baselines it is measured against are in data_parallel.h.
// Launch with torchrun; plugin/distributed/process_groups.h gives the layout
// (rank r = worker r % K of replica r / K) and the rendezvous.
//
//   auto env = conveyor::LaunchEnvironment::from_environment();
//   auto groups = std::make_shared<conveyor::ProcessGroups>(
//       conveyor::connect_store(env, std::chrono::minutes(5)), env.rank,
//       conveyor::HybridLayout::for_world(env.world_size, /*workers=*/2), conveyor::ProcessGroups::Options{});
//   conveyor::Pipeline pipe(make_model(), conveyor::PipelineOptions().workers(2).microbatches(8)
//       .optimizer(sgd).local_rank(env.local_rank), groups);
//   for (...) {
//     auto [x, y] = next_global_batch();
//     auto r = pipe.train_step(conveyor::shard(x, groups->replica(), groups->layout().replicas),
//                              conveyor::shard(y, groups->replica(), groups->layout().replicas), loss_fn);
//     if (pipe.is_logging_rank()) std::cout << r.loss << "\n";
//   }
//
// What data parallelism across replicas needs, and where it is done:
//  - identical initial weights: the constructor broadcasts every stage's
//    weights and buffers from replica 0 to the other replicas;
//  - synchronized updates: each stage's gradients are averaged across its D
//    replicas (summed for LossReduction::kSum) before every optimizer step,
//    and before a loss scaler's verdict and clipping look at them, so that
//    an overflow on any rank skips the step on every rank and the clipping
//    norm is the global batch's, over the whole model;
//  - each replica reads its own shard of the global batch: shard();
//  - the learning rate for the global batch: the option scale_learning_rate;
//  - logging, checkpointing and evaluation on one rank: is_logging_rank(),
//    the global loss on every rank in StepResult::loss, gather_model() and
//    write_atomically() (plugin/support/atomic_file.h).
//
// Overlap: a rank reduces its stage's gradients as soon as its own last
// backward is done, while the stages before it (other processes) are still
// running theirs. Asynchronous schedules reduce at every update.
//
// Failures stop the job: an error on any rank (a dead or stalled peer, a
// divergence) makes the others fail within their timeouts, each naming the
// peer and the action it waited in; the process groups are then abandoned,
// never waited on, and the process should exit (torchrun may restart the job).

#include "plugin/distributed/data_parallel.h"
#include "plugin/distributed/process_groups.h"
#include "plugin/core/options.h"
#include "plugin/runner/stage_runner.h"
#include "plugin/transport/c10d.h"

#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

namespace conveyor {

// Replica `replica`'s shard of a global batch: the replica-th of `replicas`
// equal, contiguous slices along `dim`. Averaging the replicas' gradients of a
// mean loss equals the global batch's gradient only if the slices are equal,
// so the batch must divide evenly: an error names the dimension otherwise.
at::Tensor shard(const at::Tensor& batch, int replica, int replicas, int64_t dim = 0);

class DistributedRunner {
 public:
  // Every rank passes the same model and options (the model whole: each rank
  // builds and trains only its stage; its weights are broadcast from replica 0).
  // options.workers() must be the layout's K (or 0). options.timeout() bounds
  // each wait for a neighbouring stage (an activation, a gradient), the
  // groups' timeout each collective (gradients, loss, weights). Throws
  // std::invalid_argument for a bad configuration.
  DistributedRunner(torch::nn::Sequential model, PipelineOptions options, std::shared_ptr<ProcessGroups> groups);
  // The same, for options that have passed check_option_values.
  DistributedRunner(torch::nn::Sequential model, PipelineOptions options, std::shared_ptr<ProcessGroups> groups,
                    OptionValuesChecked);

  // One step on this replica's batch (see shard()). Stage 0 reads `input`,
  // the last stage `target`; every rank of the replica passes both. With the
  // pipeline's own optimizer the step updates the weights; otherwise the
  // gradients are left averaged across replicas for the caller's optimizer.
  // StepResult::loss is the global batch's loss, on every rank.
  StepResult train_step(const at::Tensor& input, const at::Tensor& target, const LossFn& loss_fn);
  // Several inputs, outputs or targets (Pipeline::train_step over Tensors).
  StepResult train_step(const Tensors& inputs, const Tensors& targets, const TensorsLossFn& loss_fn);
  // Micro-batches the caller made (Pipeline::train_microbatches).
  StepResult train_microbatches(const std::vector<Tensors>& inputs, const std::vector<Tensors>& targets,
                                const TensorsLossFn& loss_fn);

  // Inference through this replica's pipeline: the output on the last stage,
  // an undefined tensor (an empty list) on the others. With shard
  // "parameters" it gathers each stage's weights first: collective over the
  // replicas, which all call it.
  at::Tensor forward(const at::Tensor& input);
  Tensors forward(const Tensors& inputs);

  // This rank's stage's live weights (what an optimizer steps). With shard
  // "parameters" they hold no storage outside a step (each replica's piece
  // of them is in its stage's optimizer, ShardedState) unless unshard()
  // gathered them.
  std::vector<at::Tensor> parameters() const { return runner_->parameters(); }
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() const { return runner_->named_parameters(); }
  // Bytes of the state of this rank's stages' own optimizers (with
  // shard "optimizer", this replica's shard of it).
  int64_t optimizer_state_bytes() const;
  // This rank's links to its neighbours through shared memory, each
  // direction counted (2 per neighbour on this machine); 0 where every
  // message goes over Gloo.
  int shared_memory_links() const { return transport_->shared_memory_links(); }

  // Clipping by global norm for a caller that owns its optimizer, after
  // train_step (whose gradients are then averaged across replicas): the norm
  // over the whole model, across the pipeline's processes. Collective.
  double clip_grad_norm(double max_norm, double norm_type = 2.0);

  // Global rank 0 logs, checkpoints and evaluates.
  bool is_logging_rank() const { return groups_->rank() == 0; }
  // `base` times D with scale_learning_rate, else `base`.
  double learning_rate(double base) const;

  // With shard "parameters": gathers this rank's stages' weights from every
  // replica's pieces (collective over the stage's replicas), whole until
  // reshard() or the end of the next step; otherwise nothing. FSDP2's
  // unshard() and reshard().
  void unshard();
  // Releases what unshard() gathered (local); otherwise nothing.
  void reshard();

  // Collective over replica 0 (the other replicas return at once; with shard
  // "parameters" every replica takes part, gathering its stages' weights
  // first): copies every stage's weights and buffers into the logging rank's
  // model, which then holds the whole trained model (to save or evaluate on
  // one rank; with shard "parameters", until its next step).
  void gather_model();
  // The model this rank was given (on the logging rank, after gather_model(),
  // the whole trained model).
  torch::nn::Sequential model() const { return model_; }

  StageRunner& runner() { return *runner_; }
  const StageRunner& runner() const { return *runner_; }
  ProcessGroups& groups() { return *groups_; }

 private:
  std::vector<at::Tensor> stage_tensors(int stage) const;
  // Runs `step` on this rank's pipeline (whose schedule reduces the
  // gradients of the pipeline's own optimizer across replicas), then reduces
  // a caller's optimizer's gradients across replicas, and the loss.
  StepResult finish_step(const std::function<StepResult()>& step);  // weights then buffers of a stage's layers in model_

  torch::nn::Sequential model_;
  std::shared_ptr<ProcessGroups> groups_;
  DistributedOptions distributed_;
  bool average_ = true;  // LossReduction::kMean: average gradients across replicas
  std::unique_ptr<StageRunner> runner_;
  const C10dTransport* transport_ = nullptr;  // owned by runner_
};

}  // namespace conveyor
