#pragma once
// StageRunner: a torch::nn::Sequential cut into stages, built on this
// process's workers (threads, each on its device; or, for a pipeline across
// processes, the one worker whose stages this process runs) and run by the
// runtime under a schedule. conveyor::Pipeline (plugin/pipeline.h) builds one
// from any model; tests and benchmarks that exercise the runtime build it
// directly:
//
//   conveyor::StageRunner runner(layers, conveyor::PipelineOptions().workers(2).microbatches(8));
//   auto r = runner.train_step(input, target, loss_fn);
//
// With a synchronous schedule, train_step accumulates into .grad exactly as
// loss.backward() on the unsplit model would; if a step fails, .grad may hold
// part of that step's gradient. With an asynchronous schedule (pipedream,
// ddg, fr) the runner owns one optimizer per stage (the option optimizer) and
// every micro-batch is a mini-batch: train_step(batch of M mini-batches)
// makes M updates on every stage, with the staleness the method defines, and
// drains before returning.
//
// parameters() are the live weights an optimizer steps (with weight stashing
// they are the runner's own tensors; the model's parameters hold the same
// values between steps).

#include "plugin/model/stage_split.h"
#include "plugin/core/options.h"
#include "plugin/core/step_result.h"
#include "plugin/core/types.h"
#include "schedules/schedule.h"

#include <torch/nn/modules/container/sequential.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace conveyor {

class Runtime;    // plugin/runtime/runtime.h
class Stage;      // plugin/model/stage.h
class Transport;  // plugin/transport/transport.h
struct StepData;  // plugin/runtime/runtime.h

class StageRunner {
 public:
  // Takes the model's layers (shared, not copied) and moves each to its
  // stage's device. Throws std::invalid_argument for a bad configuration,
  // before anything is moved.
  explicit StageRunner(torch::nn::Sequential model, PipelineOptions options = {});
  // The same, for options that have passed check_option_values.
  StageRunner(torch::nn::Sequential model, PipelineOptions options, OptionValuesChecked);

  // One worker of a pipeline whose other workers run in other processes (see
  // plugin/distributed/distributed_runner.h): plans the whole model as above but builds and runs
  // only the stages the schedule places on worker `local_worker` (one, or
  // its chunks under an interleaved schedule), reaching the others through
  // `transport`. Only those layers are moved and trained; parameters() are
  // their weights; train_step's loss is NaN and forward() undefined unless
  // the worker runs the last stage.
  // `replicas` (if given) reduces a stage's gradients across data-parallel
  // replicas before each update of the pipeline's optimizer: a synchronous
  // schedule gets a REDUCE_GRAD per stage (schedules::place_sharding), where
  // the runtime starts it, unless it places its own. `options` have passed
  // check_option_values (DistributedRunner's caller, or DistributedRunner).
  StageRunner(torch::nn::Sequential model, PipelineOptions options, int local_worker,
           std::unique_ptr<Transport> transport, ReplicaReduction replicas = {});
  ~StageRunner();
  StageRunner(StageRunner&&) noexcept;
  StageRunner& operator=(StageRunner&&) noexcept;

  // One training step on a whole batch: splits it into micro-batches, runs
  // the schedule, accumulates gradients. Returns the batch's loss and timings.
  StepResult train_step(const at::Tensor& input, const at::Tensor& target, const LossFn& loss_fn);
  // The same for a model of several inputs, outputs or targets: each input
  // and target is split along batch_dim() (except those declared shared),
  // stage 0's first layer receives the micro-batch's inputs, and loss_fn the
  // last stage's outputs and the micro-batch's targets.
  //   pipe.train_step({tokens, mask}, {labels}, [](const Tensors& out, const Tensors& t) {
  //     return torch::nn::functional::cross_entropy(out[0], t[0]); });
  StepResult train_step(const Tensors& inputs, const Tensors& targets, const TensorsLossFn& loss_fn);
  // One step on micro-batches the caller made (bucketing: each padded to its
  // own length): exactly options().microbatches() of them, each weighted by
  // its share of the samples (its size along batch_dim()).
  StepResult train_microbatches(const std::vector<Tensors>& inputs, const std::vector<Tensors>& targets,
                                const TensorsLossFn& loss_fn);

  // Inference: no autograd, nothing stashed; micro-batches flow through the
  // stages concurrently. Output on the last stage's device.
  at::Tensor forward(const at::Tensor& input);
  // The same for several inputs or outputs; each output is the micro-batches'
  // outputs concatenated along batch_dim().
  Tensors forward(const Tensors& inputs);

  // Clips the gradients by their global norm, as
  // torch::nn::utils::clip_grad_norm_(parameters(), max_norm, norm_type) on
  // the unsplit model: the norm over every parameter (each tied parameter
  // once), across stages and processes; every gradient is multiplied by
  // min(1, max_norm / (norm + 1e-6)). For a caller that owns its optimizer,
  // between train_step and its step; collective over the pipeline's
  // processes. Returns the norm before clipping.
  double clip_grad_norm(double max_norm, double norm_type = 2.0);

  // The loss scaler's scale and growth tracker (PipelineOptions::loss_scaling);
  // none without one. Checkpoints save and restore it.
  std::optional<LossScalerState> loss_scaler_state() const;
  void restore_loss_scaler(const LossScalerState& state);

  // The live weights, stage by stage.
  std::vector<at::Tensor> parameters() const;
  // Names as in the original Sequential ("3.weight").
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() const;

  // Training or evaluation mode of every layer (dropout, batch norm).
  void train(bool on = true);
  void eval() { train(false); }

  // Pieces of the model (the schedule's stages): workers() * chunks().
  int num_stages() const;
  // Threads (or processes) that run the stages: PipelineOptions::workers.
  int num_workers() const { return schedule_.num_workers(); }
  // Whether this process runs stage k (every stage, unless built for one).
  bool is_local(int k) const;
  const Stage& stage(int k) const;
  // Steps train_step has completed.
  int64_t completed_steps() const;
  // Sets completed_steps() and each local stage's update count (which the
  // learning-rate schedule reads) when a checkpoint is loaded.
  void restore_progress(int64_t completed_steps, const std::vector<int64_t>& stage_updates);
  const StageSplit& split() const { return split_; }
  const schedules::Schedule& schedule() const { return schedule_; }
  const PipelineOptions& options() const { return options_; }
  // The tied parameters, by name, each group in stage order (see
  // PipelineOptions::tied_parameters; groups found by the pipeline included).
  const std::vector<std::vector<std::string>>& tied_parameters() const { return tied_names_; }

 private:
  // Builds the stages (all, or only those of `local_worker` >= 0) and the runtime.
  void build(torch::nn::Sequential& model, int local_worker, std::unique_ptr<Transport> transport);
  // Runs a training step on data whose inputs and targets are set.
  StepResult train(StepData& data, const std::vector<int64_t>& samples, const TensorsLossFn& loss_fn);

  PipelineOptions options_;
  std::vector<std::vector<std::string>> tied_names_;
  schedules::Schedule schedule_;  // built and validated once, by split_stages (before split_ is set)
  StageSplit split_;
  ReplicaReduction replicas_;
  int accumulated_ = 0;  // train_steps accumulated since the last update (accumulate_steps)
  std::unique_ptr<Runtime> runtime_;
};

// The parameters and buffers by the names the original model gives them
// (plugin/model/model_names.h), stage by stage. In a pipeline that runs one
// stage of several processes (plugin/distributed/distributed_runner.h),
// those of this process's stage.
std::vector<std::pair<std::string, at::Tensor>> model_named_parameters(const StageRunner& pipe);
std::vector<std::pair<std::string, at::Tensor>> model_named_buffers(const StageRunner& pipe);

}  // namespace conveyor
