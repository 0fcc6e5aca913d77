#pragma once
// StepResult: what one pipelined step did and where its time went.

#include "schedules/action.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace conveyor {

struct TraceEvent {
  schedules::Action action;
  double start_us = 0;  // since the step began (host clock; device events on an accelerator)
  double end_us = 0;
};

struct StepResult {
  // The step's loss, equal to the unsplit model's loss on the whole batch.
  double loss = 0;
  // Each micro-batch's own loss, as loss_fn returned it (its mean, for
  // LossReduction::kMean), in micro-batch order; empty where this process
  // does not run the last stage.
  std::vector<double> microbatch_losses;
  // Wall time of the whole step.
  double wall_seconds = 0;
  // Per stage: time spent computing inside actions (forward, backward, loss,
  // optimizer steps), not waiting for a neighbour.
  std::vector<double> busy_seconds;
  // 1 - sum(busy) / (K * wall): the share of stage-time spent waiting.
  double bubble_fraction = 0;
  // Per stage: the most micro-batches whose forward had run and backward not yet.
  std::vector<int> peak_inflight;
  // Per stage: the most bytes the runtime held for in-flight micro-batches
  // (the stage's input and output tensors; autograd's own saved tensors and
  // stashed weight versions are not counted).
  std::vector<int64_t> peak_stash_bytes;
  // Per stage: the most in-flight micro-batches whose forward graph (its
  // activations) was kept, and whose input only was kept (to be replayed).
  std::vector<int> peak_stashed_activations;
  std::vector<int> peak_stashed_inputs;
  // Per stage: the most distinct stashed weight versions alive at once.
  std::vector<int> peak_weight_versions;
  // Per stage: optimizer steps the pipeline took during this step (a skipped
  // update, below, counts: it is an update by zero).
  std::vector<int> updates;
  // Whether the pipeline's own optimizers stepped at the end of this step
  // (synchronous schedules): false on a step that accumulates
  // (PipelineOptions::accumulate_steps), that a loss scaler skipped, or when
  // the caller owns the optimizer.
  bool stepped = false;
  // Updates skipped because their gradients held an inf or NaN (loss
  // scaling): 1 for a skipped synchronous step; for an asynchronous schedule
  // the updates of this process's stages that were skipped.
  int skipped_updates = 0;
  // The loss scale this step's losses were multiplied by (1 without loss
  // scaling); the scaler's next scale is StageRunner::loss_scaler_state().
  double loss_scale = 1.0;
  // The gradients' total norm before clipping (PipelineOptions::clip_grad_norm):
  // over every parameter of the model, across stages, processes and replicas,
  // each tied parameter once; for an asynchronous schedule, which clips each
  // stage's update by that stage's norm, the largest such norm of the step.
  // NaN when nothing was clipped this step.
  double grad_norm = std::numeric_limits<double>::quiet_NaN();
  // Per stage: bytes of the activations it sent to the next stage and of the
  // input gradients it sent to the previous one (what crosses a boundary;
  // under autocast, activations travel in the dtype the stage produced).
  std::vector<int64_t> activation_bytes_sent;
  std::vector<int64_t> gradient_bytes_sent;
  // One event per action, per stage, in execution order (empty when
  // PipelineOptions::trace is off).
  std::vector<std::vector<TraceEvent>> trace;

  // Chrome trace JSON (open in Perfetto or chrome://tracing): one complete
  // ("X") event per action, a track per stage.
  std::string chrome_trace_json() const;
  void write_chrome_trace(const std::string& path) const;  // throws std::runtime_error on I/O failure
  // The step as a timeline, a row per stage (plugin/trace/timeline.h), in SVG.
  // Prediction::write_timeline draws the prediction above it. Throws
  // std::invalid_argument without a trace.
  void write_timeline(const std::string& path) const;
};

}  // namespace conveyor
