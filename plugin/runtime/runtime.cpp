#include "plugin/runtime/runtime.h"

#include "plugin/runtime/action_timer.h"
#include "plugin/core/errors.h"
#include "plugin/support/fault_injection.h"
#include "plugin/runtime/step_rollback.h"
#include "plugin/runtime/step_context.h"
#include "plugin/runtime/stream_order.h"
#include "plugin/runtime/weight_versions.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>

namespace conveyor {

using schedules::Action;
using schedules::ActionKind;
using schedules::Schedule;

namespace {

std::string describe(const Action& a) {
  return c10::str(a.str(), " (", schedules::kind_name(a.kind), " of micro-batch ", a.microbatch, ")");
}

// After a stage timed out: the other stages of this process that were inside
// an action, not blocked in the transport (a stage that stalls is one).
std::string busy_stages(int k, const Schedule& schedule, const std::vector<std::pair<int, bool>>& stages) {
  std::string busy;
  for (size_t j = 0; j < stages.size(); ++j) {
    const int action = stages[j].first;
    if (static_cast<int>(j) == k || action < 0 || stages[j].second) continue;
    const Action& a = schedule.workers[schedule.worker_of(static_cast<int>(j))][static_cast<size_t>(action)];
    busy += c10::str(busy.empty() ? "" : ", ", "stage ", j, " in ", describe(a));
  }
  return busy.empty() ? "" : " (still busy meanwhile, not waiting: " + busy + ")";
}

bool is_divergence(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const DivergenceError&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace

Runtime::Runtime(std::vector<std::shared_ptr<Stage>> stages, std::unique_ptr<Transport> transport,
                 TrainingOptions training, RunningOptions running, std::vector<int> placement,
                 ReplicaReduction replicas, std::vector<TiedParameter> ties)
    : stages_(std::move(stages)),
      ties_(std::move(ties)),
      local_([&] {
        std::vector<int> local;
        for (size_t k = 0; k < stages_.size(); ++k) {
          if (stages_[k]) local.push_back(static_cast<int>(k));
        }
        return local;
      }()),
      placement_([&] {
        if (placement.empty()) {
          for (size_t k = 0; k < stages_.size(); ++k) placement.push_back(static_cast<int>(k));
        }
        check_argument(placement.size() == stages_.size(), "conveyor: the placement names ", placement.size(),
                       " stages, the runtime has ", stages_.size());
        return placement;
      }()),
      local_workers_([&] {
        std::vector<int> workers;
        for (int k : local_) {
          if (std::find(workers.begin(), workers.end(), placement_[k]) == workers.end()) {
            workers.push_back(placement_[k]);
          }
        }
        std::sort(workers.begin(), workers.end());
        return workers;
      }()),
      transport_(std::move(transport)),
      streams_(stages_.size()),
      side_streams_(stages_.size()),
      training_(std::move(training)),
      running_(std::move(running)),
      replicas_(std::move(replicas)),
      guard_(divergence_guarded(training_.divergence_guard, training_.loss_scaling.has_value())),
      workers_(static_cast<int>(local_workers_.size())) {
  if (training_.loss_scaling) scaler_.emplace(*training_.loss_scaling);
  // One thread starts the replicas' reductions, in the schedule's order, the
  // same on every replica: collectives of two threads would pair at random.
  check_argument(!replicas_ || local_workers_.size() == 1, "conveyor: a runtime that reduces across replicas runs ",
                 "one worker, not ", local_workers_.size());
  // Each worker on an accelerator computes on its own stream, so workers that
  // share a device can overlap and copies can overlap compute. A worker's
  // stages share its device and its stream (their actions run in turn).
  for (int k : local_) {
    for (int j : local_) {
      if (j < k && placement_[j] == placement_[k]) {
        check_argument(stages_[j]->device() == stages_[k]->device(), "conveyor: stages ", j, " and ", k,
                       " share worker ", placement_[k], " but not a device (", stages_[j]->device(), " and ",
                       stages_[k]->device(), ")");
        streams_[k] = streams_[j];
      }
    }
    const std::optional<c10::Device> d = stream_device(stages_[k]->device(), placement_[k]);
    if (!d) continue;
    if (!streams_[k]) streams_[k] = c10::impl::VirtualGuardImpl(d->type()).getStreamFromGlobalPool(*d);
    side_streams_[k] = c10::impl::VirtualGuardImpl(d->type()).getStreamFromGlobalPool(*d);
  }
  for (int w : local_workers_) {
    worker_streams_.emplace_back();
    for (int k : local_) {
      if (placement_[k] == w) worker_streams_.back() = streams_[k];
    }
  }
}

StepResult Runtime::run(const Schedule& schedule, const StepData& data, std::vector<Tensors>* outputs) {
  const int num = num_stages();
  check_argument(schedule.num_stages == num, "conveyor: schedule has ", schedule.num_stages, " stages, pipeline has ",
                 num);
  check_argument(static_cast<int>(data.inputs.size()) == schedule.num_microbatches, "conveyor: ", data.inputs.size(),
                 " micro-batches given to a schedule of ", schedule.num_microbatches);
  for (int k = 0; k < num; ++k) {
    check_argument(schedule.worker_of(k) == placement_[k], "conveyor: schedule '", schedule.name, "' runs stage ", k,
                   " on worker ", schedule.worker_of(k), ", the pipeline placed it on worker ", placement_[k]);
  }
  const bool training = data.loss_fn != nullptr;
  refresh_tied_copies();
  transport_->reset();
  // What this process will receive, in order: a transport may post it ahead.
  for (int w : local_workers_) {
    for (const Action& a : schedule.workers[w]) {
      if (a.kind == ActionKind::kForward && a.stage > 0) {
        transport_->expect(Channel::kActivation, a.stage - 1, a.stage, a.microbatch);
      } else if (training && schedules::is_backward(a.kind) && a.stage + 1 < num) {
        transport_->expect(Channel::kGradient, a.stage + 1, a.stage, a.microbatch);
      }
    }
  }
  // A step's backwards accumulate a tied parameter's gradient into each copy
  // from zero; what the copies held before is added back after the sum.
  std::vector<Tensors> tied_before;
  if (training) tied_before = take_tied_gradients();
  StepContext ctx(schedule, data, num);
  ctx.outputs = outputs;
  if (outputs) outputs->assign(data.inputs.size(), Tensors());

  StepRollback rollback;  // an asynchronous step updates as it goes
  if (training && !schedule.synchronous()) {
    for (int k : local_) ctx.stages[k].start_weights = rollback.keep(*stages_[k]);
  }
  // Each stage's own random streams go back too: a failed step has drawn
  // nothing, and a retried one draws the same dropout masks.
  for (int k : local_) rollback.keep_random(*stages_[k]);
  gather_unscheduled(schedule);

  // Everything the caller's thread queued before this point (its optimizer's
  // step, a loaded checkpoint, the rollback's copies, the tied copies, the
  // inputs) comes before any worker's first action (stream_order.h).
  workers_wait_for_caller(worker_streams_);
  finished_.clear();
  finished_.resize(local_workers_.size());
  const std::vector<std::exception_ptr> errors = workers_.run([&](int i) {
    // The end fence, also after a failed action: the rollback then restores
    // weights on the caller's stream, after whatever the worker queued.
    const auto finish = [&] {
      if (worker_streams_[i]) finished_[i] = worker_finished(*worker_streams_[i]);
    };
    try {
      run_worker(local_workers_[i], ctx);
      finish();
    } catch (const AbortedError&) {
      finish();
      throw;
    } catch (...) {
      finish();
      {
        std::lock_guard<std::mutex> lock(ctx.error_mutex);
        if (!ctx.first_error) ctx.first_error = std::current_exception();
      }
      ctx.failed = true;
      transport_->abort();
      throw;
    }
  });
  caller_waits_for(finished_);  // and the caller's stream comes after every worker's last action
  std::exception_ptr error = ctx.first_error;
  for (const auto& e : errors) {
    if (!error && e) error = e;  // an abort with no first error cannot happen; be loud if it does
  }
  if (!error) {
    try {
      transport_->finish_step();  // this side's messages delivered, or no weights change
      if (training) sum_tied_gradients(tied_before);
      if (training) transport_->commit();  // and every side's step came through
    } catch (const std::exception& e) {
      // After the last action, but still a failure of the step: a PipelineError.
      const int k = local_.size() == 1 ? local_[0] : -1;
      const std::string who = k >= 0 ? c10::str("stage ", k) : "the pipeline";
      error = std::make_exception_ptr(
          PipelineError(k, -1, "", c10::str("conveyor: ", who, " failed finishing the step: ", message_of(e))));
    } catch (...) {
      error = std::current_exception();
    }
  }
  const double wall = seconds_since(ctx.start);
  for (int k : local_) stages_[k]->read_live_weights();
  release_sharded_parameters();  // a failed run may have stopped where they were gathered
  if (error) {
    if (training) add_back_tied_gradients(tied_before);
    rollback.restore();
    // A stage with its own optimizer clears its gradients after each step it
    // takes, so what a failed step accumulated would leak into the next one:
    // drop it (the step is skipped). A caller's optimizer zeroes them itself.
    const bool diverged = is_divergence(error);
    for (int k : local_) {
      if (!rollback.empty() || diverged || stages_[k]->optimizer()) stages_[k]->clear_gradients();
    }
    std::rethrow_exception(error);
  }

  StepResult result;
  // A synchronous step with the pipeline's own optimizer steps once, here,
  // after every stage has shown finite gradients (or the loss scaler's
  // verdict skips it); an asynchronous one has updated as it went.
  if (training) {
    update(ctx, result);
    ++completed_steps_;
  }

  result.wall_seconds = wall;
  double busy_total = 0;
  for (int k = 0; k < num; ++k) {
    auto& st = ctx.stages[k];
    result.busy_seconds.push_back(st.busy_seconds);
    result.peak_inflight.push_back(st.stash.peak_inflight());
    result.peak_stash_bytes.push_back(st.stash.peak_bytes());
    result.peak_stashed_activations.push_back(st.stash.peak_activations());
    result.peak_stashed_inputs.push_back(st.stash.peak_inputs());
    result.peak_weight_versions.push_back(st.versions.peak());
    result.updates.push_back(st.updates);
    result.activation_bytes_sent.push_back(st.activation_bytes);
    result.gradient_bytes_sent.push_back(st.gradient_bytes);
    result.trace.push_back(std::move(st.trace));
    busy_total += st.busy_seconds;
  }
  const int runs = static_cast<int>(local_workers_.size());
  result.bubble_fraction = wall > 0 && runs > 0 ? std::max(0.0, 1.0 - busy_total / (runs * wall)) : 0.0;
  const auto& loss_sum = ctx.stages.back().loss_sum;
  result.loss = loss_sum.defined() ? loss_sum.item<double>() : std::numeric_limits<double>::quiet_NaN();
  for (const at::Tensor& l : ctx.stages.back().microbatch_losses) {
    result.microbatch_losses.push_back(l.defined() ? l.item<double>() : std::numeric_limits<double>::quiet_NaN());
  }
  return result;
}

void Runtime::run_worker(int w, StepContext& ctx) {
  const Schedule& schedule = ctx.schedule;
  std::vector<int> mine;  // the stages this worker runs
  for (int k : local_) {
    if (placement_[k] == w) mine.push_back(k);
  }
  const std::optional<c10::Stream>& stream = streams_[mine.front()];
  std::optional<c10::StreamGuard> stream_guard;
  if (stream) stream_guard.emplace(*stream);
  const bool training = ctx.training();
  c10::AutoGradMode grad_mode(training);
  if (training && schedule.weight_stashing) {
    for (int k : mine) {
      ctx.stages[k].versions.begin(schedules::forward_versions(schedule)[k], *stages_[k],
                                   ctx.stages[k].start_weights.get());
    }
  }
  ActionTimer timer(stream, running_.trace, ctx.start);

  // Where every stage is now, for a timeout's message.
  const auto busy_now = [&](int k) {
    std::vector<std::pair<int, bool>> stages;
    for (const auto& other : ctx.stages) stages.emplace_back(other.action.load(), other.blocked.load());
    return busy_stages(k, schedule, stages);
  };
  const std::vector<size_t> no_barriers;
  const auto& barriers = schedule.barriers.empty() ? no_barriers : schedule.barriers[w];
  size_t next_barrier = 0;
  const auto meet_barriers = [&](size_t position) {
    for (; next_barrier < barriers.size() && barriers[next_barrier] == position; ++next_barrier) {
      try {
        transport_->barrier(w, static_cast<int>(next_barrier));
      } catch (const TimeoutError& e) {
        const int k = mine.front();
        throw PipelineError(k, -1, "",
                            c10::str("conveyor: stage ", k, " failed at lock-step barrier ", next_barrier, ": ",
                                     message_of(e), busy_now(k)),
                            /*timed_out=*/true);
      }
    }
  };

  const std::vector<Schedule::PlacedShard> no_sharding;
  const auto& sharding = schedule.sharding.empty() ? no_sharding : schedule.sharding[w];
  size_t next_shard = 0;
  const auto run_sharding_at = [&](size_t position) {
    for (; next_shard < sharding.size() && sharding[next_shard].position == position; ++next_shard) {
      const schedules::ShardAction& a = sharding[next_shard].action;
      try {
        run_sharding(a, ctx);
      } catch (const std::exception& e) {
        throw PipelineError(a.stage, -1, a.str(),
                            c10::str("conveyor: stage ", a.stage, " failed in ", a.str(), ": ", message_of(e)));
      }
    }
  };

  const auto& actions = schedule.workers[w];
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& action = actions[i];
    const int k = action.stage;
    auto& st = ctx.stages[k];
    meet_barriers(i);
    if (ctx.failed) throw AbortedError("aborted because another stage failed");
    run_sharding_at(i);
    // New weight gradients: the stage's last reduction, where it accumulates,
    // is finished first, so that its whole-gradient buffers are gone (a wait
    // of the REDUCE_GRAD, not time of this action).
    if (replicas_.accumulates && st.reducing &&
        (action.kind == ActionKind::kBackward || action.kind == ActionKind::kWeight)) {
      try {
        std::exchange(st.reducing, nullptr)();
      } catch (const std::exception& e) {
        throw PipelineError(k, -1, "REDUCE_GRAD",
                            c10::str("conveyor: stage ", k, " failed waiting for its REDUCE_GRAD before ", action.str(),
                                     ": ", message_of(e)));
      }
    }
    // An offloaded input comes back while this action computes.
    if (schedule.stash == schedules::Stash::kOffload && i + 1 < actions.size() &&
        schedules::is_backward(actions[i + 1].kind)) {
      if (StashEntry* next = ctx.stages[actions[i + 1].stage].stash.find(actions[i + 1].microbatch)) {
        prefetch(actions[i + 1].stage, *next);
      }
    }
    st.wait_in = st.wait_out = 0;
    st.action = static_cast<int>(i);
    timer.begin();
    try {
      if (FaultInjector* faults = fault_injector()) faults->before_action(k, action);
      run_action(action, ctx);
    } catch (const AbortedError&) {
      throw;
    } catch (const DivergenceError&) {
      throw;
    } catch (const std::exception& e) {
      std::string message = c10::str("conveyor: stage ", k, " failed in ", describe(action), ": ", message_of(e));
      const bool timed_out = dynamic_cast<const TimeoutError*>(&e) != nullptr;
      if (timed_out) message += busy_now(k);
      throw PipelineError(k, action.microbatch, action.str(), message, timed_out);
    }
    st.action = -1;
    st.versions.note_peak();
    timer.end(action, st.wait_in, st.wait_out);
  }
  meet_barriers(actions.size());
  run_sharding_at(actions.size());

  if (training && schedule.synchronous() && guard_) {
    for (int k : mine) {
      if (!ctx.stages[k].checked) check_finite(k, -1, "gradient", stages_[k]->made_gradients(), ctx, "");
    }
  }
  // Beside the end fence (run), the host waits when it reads values: a
  // training step's losses and the times of the actions on the stream. A
  // forward returns once its work is queued.
  if (stream && (training || running_.trace)) stream->synchronize();
  timer.finish();
  for (int k : mine) ctx.stages[k].busy_seconds = timer.busy_seconds(k);
  for (TraceEvent& e : timer.trace()) ctx.stages[e.action.stage].trace.push_back(e);
}

}  // namespace conveyor
