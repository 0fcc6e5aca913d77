#pragma once
// Runtime: executes a Schedule over stages and a transport. It knows nothing of
// which method produced the schedule: every worker thread walks its own action
// list (the actions of the one stage it runs, or of several: virtual stages),
// and does what the schedule declares around each action (stash the graph or
// only the input, in device or host memory, read the live or a stashed weight
// version, split a backward into input and weight gradients, step the stage's
// optimizer after a backward, meet lock-step barriers).

#include "plugin/core/option_list.h"
#include "plugin/runtime/activation_stash.h"
#include "plugin/runtime/loss_scaler.h"
#include "plugin/model/stage.h"
#include "plugin/core/step_result.h"
#include "plugin/core/types.h"
#include "plugin/transport/transport.h"
#include "plugin/runtime/workers.h"
#include "schedules/schedule.h"

#include <c10/core/ScalarType.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace conveyor {

struct StepData {
  std::vector<Tensors> inputs;        // per micro-batch, fed to stage 0
  std::vector<Tensors> targets;       // per micro-batch, given to loss_fn on the last stage
  std::vector<double> loss_scale;     // per micro-batch, multiplies its loss before its backward
  std::vector<double> report_weight;  // per micro-batch, its share of the step's reported loss
  const TensorsLossFn* loss_fn = nullptr;  // null: inference (no autograd, nothing stashed)
  // A synchronous step with the pipeline's own optimizers: whether it ends
  // with their update (false while accumulating gradients over steps).
  bool update = true;
};

// One logical parameter held by several stages (tied weights): entry i is
// (stage, index into that stage's live weights), stages ascending. After a
// synchronous step's backwards every holder's gradient is the sum over the
// holders (added in stage order), so identical copies stay identical.
using TiedParameter = std::vector<std::pair<int, size_t>>;

class Runtime {
 public:
  // `stages[k]` may be null for a stage that runs in another process (the
  // transport reaches it); this process runs the others, one thread each.
  // placement[k]: the worker (thread) that runs stage k; the schedules run
  // must place stages the same way (empty: one worker per stage). A worker's
  // stages share its device and stream. `replicas` reduces a stage's
  // gradients across data-parallel replicas before an update: started where
  // the schedule's REDUCE_GRAD for the stage stands, so that it overlaps the
  // worker's remaining actions, or at the update where the schedule has none
  // (a stage holding a tied parameter, whose gradient is the sum over its
  // holders made after the last action, must have none). The training
  // and running sections are PipelineOptions' (plugin/core/option_list.h); with a
  // loss scaler, the caller multiplies each micro-batch's loss by
  // loss_scaler()->scale().
  Runtime(std::vector<std::shared_ptr<Stage>> stages, std::unique_ptr<Transport> transport, TrainingOptions training,
          RunningOptions running, std::vector<int> placement = {}, ReplicaReduction replicas = {},
          std::vector<TiedParameter> ties = {});

  // Gives every holder of a tied parameter the first holder's value (across
  // processes through the transport): called once, when the pipeline is built.
  void unify_tied_values();
  // Before every run: a tied parameter that a caller's optimizer steps (no
  // stage optimizer) is stepped once, in its first holder (the tensor the
  // caller's model owns; parameters() lists each tied parameter once), and
  // the later holders in this process take its value.
  void refresh_tied_copies();

  // Runs `schedule` once. On inference, `outputs` (if given) receives the last
  // stage's output per micro-batch. Throws PipelineError naming the stage,
  // micro-batch and action of the first failure (DivergenceError for a
  // non-finite loss or gradient); the other stages stop.
  StepResult run(const schedules::Schedule& schedule, const StepData& data, std::vector<Tensors>* outputs = nullptr);

  int num_stages() const { return static_cast<int>(stages_.size()); }
  int worker_of(int k) const { return placement_.at(k); }
  bool is_local(int k) const { return stages_.at(k) != nullptr; }
  const Stage& stage(int k) const { return *stages_.at(k); }
  Stage& stage(int k) { return *stages_.at(k); }
  // Training steps completed (run() calls with a loss that succeeded).
  int64_t completed_steps() const { return completed_steps_; }
  void restore_completed_steps(int64_t steps) { completed_steps_ = steps; }

  // The total norm of this pipeline's gradients (every stage, across
  // processes; each tied parameter once), and every gradient multiplied by
  // min(1, max_norm / (norm + 1e-6)) as torch::nn::utils::clip_grad_norm_
  // does. Collective over the pipeline's processes. Returns the norm.
  double clip_grad_norm(double max_norm, double norm_type);
  // Null without loss scaling.
  LossScaler* loss_scaler() { return scaler_ ? &*scaler_ : nullptr; }
  const LossScaler* loss_scaler() const { return scaler_ ? &*scaler_ : nullptr; }

 private:
  // What one run() keeps while the workers run (step_context.h): the
  // schedule and data of the step, and each stage's stash and counters.
  struct StepContext;
  // The step loop (runtime.cpp): worker w's line of the schedule.
  void run_worker(int w, StepContext& ctx);
  void run_action(const schedules::Action& action, StepContext& ctx);

  // Forward and backward actions (actions.cpp).
  void forward(int k, int mb, StepContext& ctx);
  void backward(int k, int mb, StepContext& ctx);
  // The last stage's loss of micro-batch mb (a scalar; checked).
  at::Tensor loss_of(int mb, const Tensors& outputs, const StepData& data) const;
  // An inputs-only stash entry's backward roots: its forward again, with grad
  // (and every layer's outputs in the entry, for a split backward).
  Tensors replay_forward(int k, int mb, StashEntry& entry, const StepData& data, bool keep_layer_outputs);
  // The gradients stage k+1 sent for micro-batch mb, checked against `roots`.
  Tensors receive_gradients(int k, int mb, const Tensors& roots, StepContext& ctx);
  void send_input_gradients(int k, int mb, const Tensors& inputs, StepContext& ctx);

  // A split backward (split_backward.cpp): I computes and sends the input
  // gradients and keeps every layer's output gradients; W computes the
  // weights' gradients from them, layer by layer.
  void backward_input(int k, int mb, StepContext& ctx);
  void backward_weight(int k, int mb, StepContext& ctx);

  // Offloaded stashes (offload.cpp; schedules::Stash::kOffload): the entry's
  // inputs to host memory after a forward, back ahead of the backward that
  // needs them.
  void offload(int k, StashEntry& entry);
  void prefetch(int k, StashEntry& entry);
  void bring_back(int k, StashEntry& entry);

  // Tied parameters (tied_gradients.cpp; see TiedParameter): each local
  // copy's gradient is taken out before a step (per tie, per entry), then
  // every copy gets what it held plus the sum over the holders of the step's
  // gradients; after a failure, what it held plus whatever the step added.
  std::vector<Tensors> take_tied_gradients();
  void sum_tied_gradients(const std::vector<Tensors>& before);
  void add_back_tied_gradients(const std::vector<Tensors>& before);

  // A sharding action of the schedule (update.cpp): REDUCE_GRAD starts the
  // replicas' reduction of the stage's gradients (the guard checks them
  // first), which update() waits for, or, where the reduction accumulates,
  // the stage's next backward (run_worker); UNSHARD and RESHARD gather and
  // release the parameters of a stage whose replicas shard them.
  void run_sharding(const schedules::ShardAction& action, StepContext& ctx);
  // Before a run: gathers, for the whole run, the sharded parameters of the
  // stages that `schedule` does not gather itself (inference, a given
  // schedule without UNSHARD). Collective over each stage's replicas.
  void gather_unscheduled(const schedules::Schedule& schedule);
  // After a run: every stage's sharded parameters released.
  void release_sharded_parameters();

  // Updates (optimizer_step.cpp): the divergence guard's check, and stage
  // k's optimizer step, after micro-batch mb's backward (schedules that step
  // per micro-batch) or once after the step (mb = -1).
  void check_finite(int k, int mb, const char* what, const std::vector<at::Tensor>& tensors, const StepContext& ctx,
                    const std::string& action) const;
  void optimizer_step(int k, int mb, StepContext& ctx);
  // After a training step's last action (update.cpp): a synchronous step's
  // update (replicas' gradients reduced, the loss scaler's verdict,
  // unscaling, clipping, the optimizers' steps), or an asynchronous step's
  // scaler verdict.
  void update(StepContext& ctx, StepResult& result);
  // The local part of the gradients' norm (update.cpp): a CPU double holding
  // the sum of |g|^p over this process's gradients (the largest |g| for p =
  // inf); `grads` receives the gradients to clip. Each tied parameter counts
  // at its first holder only.
  at::Tensor local_norm_part(double norm_type, std::vector<at::Tensor>& grads) const;

  std::vector<std::shared_ptr<Stage>> stages_;
  std::vector<TiedParameter> ties_;
  std::vector<int> local_;  // indices of the stages this process runs
  std::vector<int> placement_;  // stage -> worker
  std::vector<int> local_workers_;  // the workers this process runs, one thread each
  std::unique_ptr<Transport> transport_;
  std::vector<std::optional<c10::Stream>> streams_;  // per stage (its worker's), on accelerators
  std::vector<std::optional<c10::Stream>> side_streams_;  // per stage: offload copies
  std::vector<std::optional<c10::Stream>> worker_streams_;  // per local worker (local_workers_' order)
  std::vector<std::optional<c10::Event>> finished_;  // per local worker: its stream's end of the last run
  TrainingOptions training_;
  RunningOptions running_;
  ReplicaReduction replicas_;
  // The divergence guard's checks run: asked for, and no loss scaler (whose
  // verdict an inf or NaN then is).
  bool guard_ = true;
  std::optional<LossScaler> scaler_;
  WorkerThreads workers_;
  int64_t completed_steps_ = 0;
};

}  // namespace conveyor
