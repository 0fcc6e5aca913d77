#pragma once
// PipelineOptions: everything a Pipeline is configured with, one documented
// field each, set builder-style: PipelineOptions().workers(4).microbatches(8).
//
// Words: a *stage* is a piece of the model (a run of layers); a *worker* is
// the thread, or process, that runs one or more stages on its device
// (torch.distributed.pipelining says rank). With one chunk per worker,
// worker k runs stage k.

#include "plugin/types.h"

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace conveyor {

struct ModelProfile;  // plugin/planner/profile.h

// How a torch::nn::Sequential is cut into stages when no boundaries are given.
enum class Balance {
  kUniform,     // the same number of layers per stage (earlier stages take the remainder)
  kParameters,  // contiguous stages whose largest parameter count is as small as possible
  kTime,        // contiguous stages whose slowest (measured time with transfers) is as fast as possible,
                // within memory_budgets(), never splitting atomic_groups(); needs profile()
};

// How the loss function reduces over a micro-batch. The pipeline weights each
// micro-batch's loss so that the step's loss and gradients equal the unsplit
// model's on the whole batch.
enum class LossReduction {
  kMean,  // loss_fn returns a mean over its micro-batch's samples: weighted by n_mb / N
  kSum,   // loss_fn returns a sum: added as is
};

// Makes one stage's optimizer over that stage's live weights, e.g.
//   [](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, 0.1); }
using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

// The learning rate of the n-th update (n counts from 0).
using LearningRateSchedule = std::function<double(int64_t update)>;

// What a learning-rate schedule's update count counts.
enum class UpdateUnit {
  kBatch,       // train_step calls: synchronous schedules update once per batch
  kMicrobatch,  // micro-batches: asynchronous schedules update after each one, on each stage
};

// Dynamic loss scaling, with the semantics of torch.amp.GradScaler: each
// micro-batch's loss is multiplied by the scale before its backward; an
// update whose gradients hold an inf or NaN is skipped and the scale
// multiplied by backoff_factor; after growth_interval clean updates in a row
// it is multiplied by growth_factor. Clean gradients are divided by the scale
// before they are clipped and stepped.
struct LossScaling {
  TORCH_ARG(double, init_scale) = 65536.0;
  TORCH_ARG(double, growth_factor) = 2.0;
  TORCH_ARG(double, backoff_factor) = 0.5;
  TORCH_ARG(int64_t, growth_interval) = 2000;
};

struct PipelineOptions {
  // Number of workers K: threads (or processes), one device each. 0 means:
  // (boundaries().size() + 1) / chunks if boundaries are given, else
  // devices().size() if more than one device is given, else 1.
  TORCH_ARG(int, workers) = 0;
  // Stages per worker (chunks; "virtual stages"): the model is cut into
  // workers() * chunks() stages, stage s running on worker s % K
  // (interleaved schedules). 0: the schedule's own, 2 for "interleaved" and
  // "zb-interleaved", 1 for the others (which take only 1).
  // Pipeline::num_stages() counts stages, and boundaries() cut stages.
  TORCH_ARG(int, chunks) = 0;
  // Number of micro-batches M a batch is split into along batch_dim().
  TORCH_ARG(int, microbatches) = 1;
  // Schedule name: "sequential", "gpipe", "1f1b", "eager-1f1b", "interleaved",
  // "zb-h1", "zb-interleaved" (synchronous: exact gradients of the whole
  // batch) or "pipedream", "ddg", "fr" (asynchronous: every micro-batch is a
  // mini-batch with its own update on every stage; the pipeline fills and
  // drains within each train_step). See schedules/generators.h.
  TORCH_ARG(std::string, schedule) = "1f1b";
  // "eager-1f1b" only: forwards each stage runs ahead of 1F1B's warm-up per
  // later stage, to hide a slow link's latency (schedules/generators.h). 0:
  // the schedule's default, 1.
  TORCH_ARG(int, lookahead) = 0;
  // Activation recomputation: each stage keeps only its inputs between a
  // forward and its backward, which replays the forward first (synchronous
  // schedules; exact gradients, random layers replayed with stage_rng()).
  TORCH_ARG(bool, recompute) = false;
  // Recomputation whose kept inputs wait in pinned host memory: copied out
  // on a side stream after the forward, back ahead of the backward. On a CPU
  // stage it is recomputation alone (the inputs already live in host memory).
  TORCH_ARG(bool, offload) = false;
  // PipeDream only: every stage's forward of a micro-batch uses the weight
  // version stage 0's forward used. Asking it of another schedule is an error.
  TORCH_ARG(bool, vertical_sync) = false;
  // A schedule in text form (schedules::Schedule::parse), or
  // torch.distributed.pipelining's CSV (a row of actions per rank); overrides
  // schedule() when not empty. Its lines are the workers and name the stages
  // they run; its counts must match the options'.
  TORCH_ARG(std::string, schedule_text) = "";
  // Device of each worker: "cpu", "cuda", "cuda:N". One entry puts every
  // worker on it; otherwise one per worker (a worker's stages share its
  // device). Several workers may share a device. Empty: cpu.
  TORCH_ARG(std::vector<std::string>, devices) = {};
  // Explicit split points: the index of the first layer of stages 1..S-1,
  // strictly increasing, each in (0, number of layers). Overrides balance().
  TORCH_ARG(std::vector<int64_t>, boundaries) = {};
  // Partition policy when boundaries() is empty.
  TORCH_ARG(Balance, balance) = Balance::kUniform;
  // Balance::kTime: the measured costs of the model's layers (profile_model,
  // plugin/planner/profile.h), taken at the micro-batch size the pipeline will run.
  TORCH_ARG(std::shared_ptr<const ModelProfile>, profile) = nullptr;
  // Balance::kTime: runs of layers [first, last] that stay in one stage.
  TORCH_ARG(std::vector<AtomicGroup>, atomic_groups) = {};
  // Balance::kTime: bytes each stage's device may hold (weights, gradients,
  // optimizer state, stashed micro-batches; see plugin/planner/planner.h). One entry
  // for every stage, or one per stage; empty: no limit.
  TORCH_ARG(std::vector<int64_t>, memory_budgets) = {};
  // Bytes of optimizer state per byte of trainable weights, for the memory
  // prediction: 0 for plain SGD, 1 with momentum, 2 for Adam.
  TORCH_ARG(double, optimizer_state_per_weight) = 0;
  // Dimension of input and target along which a batch is split into
  // micro-batches. A batch of N samples gives micro-batches of N / M samples,
  // the first N % M of them one larger (torch::tensor_split); N < M is an error.
  TORCH_ARG(int64_t, batch_dim) = 0;
  // Several inputs or targets (train_step and forward over Tensors): the
  // indices of those that go whole to every micro-batch instead of being
  // split (a [T, T] causal mask, class weights). The others must all have
  // the same size along batch_dim(); an undefined one stays undefined.
  TORCH_ARG(std::vector<int64_t>, shared_inputs) = {};
  TORCH_ARG(std::vector<int64_t>, shared_targets) = {};
  // Tied weights: each group names parameters (as named_parameters() does,
  // "0.weight") that are one logical parameter held by several layers, e.g.
  // the input embedding and the output projection of a language model. The
  // pipeline gives every copy the value of the copy in the earliest layer
  // when it is built, and
  // after each step's backwards the sum of all their gradients, so the copies
  // stay identical under any elementwise optimizer, across devices and
  // processes. A tensor registered in layers of several stages (the same
  // tensor, not copies) is such a group by itself: TorchScript layers then get
  // a copy each; other layers cannot, and are refused with this option's name.
  // Only synchronous schedules accept ties (an asynchronous one would step
  // each copy with a different gradient).
  TORCH_ARG(std::vector<std::vector<std::string>>, tied_parameters) = {};
  // What loss_fn returns; see LossReduction.
  TORCH_ARG(LossReduction, loss_reduction) = LossReduction::kMean;
  // Messages a stage-to-stage channel buffers before a send blocks. The
  // schedule is validated against this capacity, so a validated schedule
  // cannot deadlock; 0 (rendezvous) deadlocks 1F1B and is rejected for it.
  // eager-1f1b raises it to its lookahead + 1 (the forwards it runs ahead).
  TORCH_ARG(int, channel_capacity) = 2;
  // Upper bound on every blocking wait (a receive, a send into a full
  // channel). Passing it is an error naming the stage and what it waited for.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::minutes(5);
  // Record one trace event per action in StepResult::trace.
  TORCH_ARG(bool, trace) = true;
  // The pipeline's own optimizer, one per stage over that stage's weights.
  // Required by asynchronous schedules (they step after every micro-batch);
  // optional for synchronous ones, where train_step then also steps it and
  // clears the gradients. Without it the caller steps its own optimizer over
  // parameters().
  TORCH_ARG(OptimizerFactory, optimizer) = nullptr;
  // Sets the learning rate of every param group before each of the
  // pipeline's optimizer steps; needs optimizer(). Its unit must match the
  // schedule's updates: kMicrobatch for asynchronous schedules, kBatch for
  // synchronous ones (anything else is an error, not a silent rescale).
  TORCH_ARG(LearningRateSchedule, lr_schedule) = nullptr;
  TORCH_ARG(UpdateUnit, lr_schedule_unit) = UpdateUnit::kBatch;
  // Stop with a DivergenceError at a non-finite loss or gradient, keeping the
  // weights (and the pipeline's optimizer state) of the last good step. Costs
  // one host synchronisation per stage per step (per micro-batch for
  // asynchronous schedules). Whatever fails, an asynchronous step is rolled
  // back to the weights and optimizer state it started from.
  TORCH_ARG(bool, divergence_guard) = true;
  // Once a stage has sent its outputs to a stage in another process or on
  // another device (which receives a copy), it releases their data and keeps
  // their autograd graph, all its backward needs (Megatron's
  // deallocate_output_tensor). The stash's bytes fall by the outputs'
  // (StepResult::peak_stash_bytes; the planner predicts it); memory falls by
  // as much where the graph does not keep the output itself (an operation
  // that saves its result, such as tanh or ReLU, keeps it). Not under
  // schedules that split the backward (zero bubble), whose W reads every
  // layer's outputs.
  TORCH_ARG(bool, free_sent_activations) = true;
  // Each stage draws random numbers (dropout) from its own streams, seeded
  // from the global CPU generator's seed when the pipeline is built and the
  // stage's index, so that runs with random layers in several stages repeat
  // bit for bit and checkpoints restore every stage's streams. Forwards of
  // different stages then take turns (see plugin/model/stage_random.h).
  TORCH_ARG(bool, stage_rng) = false;

  // --- training options (see README, "Training options") -------------------
  // Mixed precision: every stage's forward (and the loss) runs under autocast
  // to this dtype on the stage's device, at::kBFloat16 or at::kHalf, as
  // torch.autocast would run the unsplit model; weights, gradients and
  // optimizer state stay in their own dtype (fp32). An activation crosses a
  // boundary in the dtype its stage produced (a Linear's bf16 output: half
  // the bytes of fp32), and the receiving stage takes it as it is: autocast
  // casts it per op (to bf16 for a matmul, to fp32 for a softmax or a norm),
  // and its gradient travels back in the same dtype.
  TORCH_ARG(std::optional<c10::ScalarType>, autocast) = std::nullopt;
  // Dynamic loss scaling (fp16 needs it; see LossScaling). One verdict per
  // update: on a synchronous schedule an inf or NaN in any gradient of any
  // stage, process or replica skips the step on all of them; an asynchronous
  // schedule keeps its scale for the whole train_step, skips (per stage) each
  // update whose gradients are not finite, the update still counting as one
  // (an update by zero: the weight version advances to an identical copy, so
  // weight stashing and vertical sync keep their arithmetic), and backs the
  // scale off after a step in which any update was skipped. Needs the
  // pipeline's own optimizer. With a scaler on, non-finite gradients (and
  // losses) are the scaler's verdict, not the divergence guard's error.
  TORCH_ARG(std::optional<LossScaling>, loss_scaling) = std::nullopt;
  // Clipping by global norm, > 0 to clip: before the pipeline's own
  // optimizers step, every gradient is multiplied by
  // min(1, max_norm / (total_norm + 1e-6)), as torch::nn::utils::clip_grad_norm_
  // would on the unsplit model. Synchronous schedules: the norm over every
  // parameter of the model, across stages, processes and replicas, each tied
  // parameter once. Asynchronous schedules clip each stage's update by that
  // stage's own norm (the other stages' gradients of the same micro-batch do
  // not exist yet when it must step). Callers that own their optimizer call
  // Pipeline::clip_grad_norm instead. Needs the pipeline's own optimizer.
  TORCH_ARG(double, clip_grad_norm) = 0;
  // The norm clipping uses: 2 (Euclidean), any p > 0, or infinity (the largest |g|).
  TORCH_ARG(double, clip_norm_type) = 2.0;
  // Gradient accumulation for the pipeline's own optimizer (synchronous
  // schedules): train_step accumulates, and every n-th one steps (and clears
  // the gradients). Each step's loss is weighted 1/n (LossReduction::kMean),
  // so n steps on equal batches update as one step on their concatenation.
  // A failed step drops what the window had accumulated.
  TORCH_ARG(int, accumulate_steps) = 1;

 public:
  // Renamed: the count of threads or processes is workers(); a stage is a
  // piece of the model. Calling stages() fails to compile with this message.
  template <typename Renamed = int>
  PipelineOptions& stages(int) {
    static_assert(sizeof(Renamed) == 0, "PipelineOptions::stages(n) is now workers(n): a stage is a piece of the "
                                        "model, a worker the thread or process that runs one or more stages");
    return *this;
  }
  template <typename Renamed = int>
  int stages() const {
    static_assert(sizeof(Renamed) == 0, "PipelineOptions::stages() is now workers()");
    return 0;
  }
};

}  // namespace conveyor
