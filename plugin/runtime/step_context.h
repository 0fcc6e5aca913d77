#pragma once
// What one Runtime::run keeps while its workers run: the step's schedule and
// data, and each stage's stash, weight versions and counters. Every action
// reads what it needs from here. Internal to the runtime.

#include "plugin/runtime/activation_stash.h"
#include "plugin/runtime/runtime.h"
#include "plugin/core/step_result.h"
#include "plugin/runtime/weight_versions.h"
#include "plugin/support/timing.h"

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <vector>

namespace conveyor {

struct Runtime::StepContext {
  struct PerStage {
    ActivationStash stash;
    WeightVersions versions;
    // The weights before the step, kept to roll an asynchronous step back:
    // also its weight version 0 (no second copy).
    std::shared_ptr<const WeightVersion> start_weights;
    double busy_seconds = 0;
    // Seconds the current action spent blocked in the transport before and
    // after its compute: not busy time.
    double wait_in = 0, wait_out = 0;
    std::vector<TraceEvent> trace;
    at::Tensor loss_sum;
    std::vector<at::Tensor> microbatch_losses;  // the last stage's, by micro-batch
    int updates = 0;
    // Updates a loss scaler skipped, and the largest norm an update of an
    // asynchronous schedule was clipped by (NaN: none).
    int skipped = 0;
    double grad_norm = std::numeric_limits<double>::quiet_NaN();
    // Bytes sent to the neighbours: activations forward, input gradients back.
    int64_t activation_bytes = 0, gradient_bytes = 0;
    // The replicas' reduction of the stage's gradients, started at its
    // REDUCE_GRAD and waited for by the update (ReplicaReduction::start), or
    // by the stage's next backward where it accumulates.
    std::function<void()> reducing;
    // Whether the divergence guard checked the gradients at a REDUCE_GRAD
    // (then not again at the end of the worker's line).
    bool checked = false;
    // The index of the action the stage is in (-1: none), and whether it is
    // blocked in the transport: a timeout's message names the stages busy in
    // an action, the likely cause of the wait.
    std::atomic<int> action{-1};
    std::atomic<bool> blocked{false};
  };
  StepContext(const schedules::Schedule& schedule, const StepData& data, int num_stages)
      : schedule(schedule), data(data), stages(num_stages) {}
  const schedules::Schedule& schedule;
  const StepData& data;
  bool training() const { return data.loss_fn != nullptr; }
  std::vector<PerStage> stages;
  std::vector<Tensors>* outputs = nullptr;
  Clock::time_point start = Clock::now();
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr first_error;
};


// Runs a blocking transport call, adding its duration to `seconds`. `blocked`
// is set meanwhile, and stays set if the call throws: a stage whose wait
// failed was waiting, not busy.
template <typename Fn>
auto waited(double& seconds, std::atomic<bool>& blocked, Fn&& fn) {
  const auto t0 = Clock::now();
  blocked = true;
  struct Add {
    double& seconds;
    std::atomic<bool>& blocked;
    Clock::time_point t0;
    int exceptions = std::uncaught_exceptions();
    ~Add() {
      seconds += std::chrono::duration<double>(Clock::now() - t0).count();
      if (std::uncaught_exceptions() == exceptions) blocked = false;
    }
  } add{seconds, blocked, t0};
  return fn();
}

}  // namespace conveyor
