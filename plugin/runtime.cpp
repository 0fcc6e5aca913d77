#include "plugin/runtime.h"

#include "ops/nonfinite/nonfinite.h"
#include "plugin/action_timer.h"
#include "plugin/errors.h"
#include "plugin/step_rollback.h"
#include "plugin/weight_versions.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <sstream>

namespace conveyor {

using schedules::Action;
using schedules::ActionKind;
using schedules::Schedule;
using Clock = std::chrono::steady_clock;

namespace {

std::string describe(const Action& a) {
  std::ostringstream os;
  os << a.str() << " (" << schedules::kind_name(a.kind) << " of micro-batch " << a.microbatch << ")";
  return os.str();
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

// Runs a blocking transport call, adding its duration to `seconds`.
template <typename Fn>
auto waited(double& seconds, Fn&& fn) {
  const auto t0 = Clock::now();
  struct Add {
    double& seconds;
    Clock::time_point t0;
    ~Add() { seconds += std::chrono::duration<double>(Clock::now() - t0).count(); }
  } add{seconds, t0};
  return fn();
}

// Runs the stage's layers, under its own random streams when it has them;
// `start` (if given) receives where the streams stood, for a replay.
at::Tensor run_layers(const Stage& stage, const at::Tensor& x, std::optional<StageRandom::State>* start) {
  StageRandom* random = stage.random();
  if (!random) return stage.forward(x);
  if (start) *start = random->state();
  at::Tensor y;
  random->run([&] { y = stage.forward(x); });
  return y;
}

// What a forward leaves for its backward, as the schedule declares: the
// graph (the grad-requiring input, if any, and the root to differentiate),
// or only the input, from which the backward replays the forward.
void keep_for_backward(StashEntry& entry, bool inputs_only, const at::Tensor& input, bool input_is_leaf,
                       const at::Tensor& output, const at::Tensor& root) {
  entry.inputs_only = inputs_only;
  if (inputs_only) {
    entry.input = input;
    entry.bytes = tensor_bytes(input);
  } else {
    entry.input = input_is_leaf ? input : at::Tensor();
    entry.root = root;
    entry.bytes = tensor_bytes(entry.input) + tensor_bytes(output);
  }
}

}  // namespace

struct Runtime::StepContext {
  struct PerStage {
    ActivationStash stash;
    WeightVersions versions;
    double busy_seconds = 0;
    // Seconds the current action spent blocked in the transport before and
    // after its compute: not busy time.
    double wait_in = 0, wait_out = 0;
    std::vector<TraceEvent> trace;
    at::Tensor loss_sum;
    int updates = 0;
  };
  explicit StepContext(int k) : stages(k) {}
  std::vector<PerStage> stages;
  std::vector<at::Tensor>* outputs = nullptr;
  Clock::time_point start = Clock::now();
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr first_error;
};

Runtime::Runtime(std::vector<std::shared_ptr<Stage>> stages, std::unique_ptr<Transport> transport,
                 RuntimeOptions options)
    : stages_(std::move(stages)),
      local_([&] {
        std::vector<int> local;
        for (size_t k = 0; k < stages_.size(); ++k) {
          if (stages_[k]) local.push_back(static_cast<int>(k));
        }
        return local;
      }()),
      transport_(std::move(transport)),
      streams_(stages_.size()),
      options_(std::move(options)),
      workers_(static_cast<int>(local_.size())) {
  // Each stage on an accelerator computes on its own stream, so stages that
  // share a device can overlap and copies can overlap compute.
  for (int k : local_) {
    const c10::Device& d = stages_[k]->device();
    if (!d.is_cpu()) streams_[k] = c10::impl::VirtualGuardImpl(d.type()).getStreamFromGlobalPool(d);
  }
}

StepResult Runtime::run(const Schedule& schedule, const StepData& data, std::vector<at::Tensor>* outputs) {
  const int num = num_stages();
  TORCH_CHECK(schedule.num_stages == num, "conveyor: schedule has ", schedule.num_stages, " stages, pipeline has ",
              num);
  TORCH_CHECK(static_cast<int>(data.inputs.size()) == schedule.num_microbatches, "conveyor: ", data.inputs.size(),
              " micro-batches given to a schedule of ", schedule.num_microbatches);
  const bool training = data.loss_fn != nullptr;
  transport_->reset();
  StepContext ctx(num);
  ctx.outputs = outputs;
  if (outputs) outputs->assign(data.inputs.size(), at::Tensor());

  StepRollback rollback;  // an asynchronous step updates as it goes
  if (training && !schedule.synchronous()) {
    for (int k : local_) rollback.keep(*stages_[k]);
  }

  const std::vector<std::exception_ptr> errors = workers_.run([&](int i) {
    const int k = local_[i];
    try {
      run_stage(k, schedule, data, ctx);
    } catch (const AbortedError&) {
      throw;
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(ctx.error_mutex);
        if (!ctx.first_error) ctx.first_error = std::current_exception();
      }
      ctx.failed = true;
      transport_->abort();
      throw;
    }
  });
  std::exception_ptr error = ctx.first_error;
  for (const auto& e : errors) {
    if (!error && e) error = e;  // an abort with no first error cannot happen; be loud if it does
  }
  if (!error) {
    try {
      transport_->finish_step();  // this side's messages delivered, or no weights change
    } catch (...) {
      error = std::current_exception();
    }
  }
  const double wall = std::chrono::duration<double>(Clock::now() - ctx.start).count();
  for (int k : local_) stages_[k]->read_live_weights();
  if (error) {
    rollback.restore();
    if (!rollback.empty() || is_divergence(error)) {
      for (int k : local_) stages_[k]->clear_gradients();
    }
    std::rethrow_exception(error);
  }

  // A synchronous step with the pipeline's own optimizer steps once, here,
  // after every stage has shown finite gradients.
  if (training && schedule.synchronous()) {
    for (int k : local_) {
      Stage& stage = *stages_[k];
      if (!stage.optimizer()) continue;
      stage.step(options_.learning_rate ? options_.learning_rate(stage.updates()) : -1.0);
      ++ctx.stages[k].updates;
    }
  }
  if (training) ++completed_steps_;

  StepResult result;
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
    result.trace.push_back(std::move(st.trace));
    busy_total += st.busy_seconds;
  }
  const int runs = static_cast<int>(local_.size());
  result.bubble_fraction = wall > 0 && runs > 0 ? std::max(0.0, 1.0 - busy_total / (runs * wall)) : 0.0;
  const auto& loss_sum = ctx.stages.back().loss_sum;
  result.loss = loss_sum.defined() ? loss_sum.item<double>() : std::numeric_limits<double>::quiet_NaN();
  return result;
}

void Runtime::run_stage(int k, const Schedule& schedule, const StepData& data, StepContext& ctx) {
  std::optional<c10::StreamGuard> stream_guard;
  if (streams_[k]) stream_guard.emplace(*streams_[k]);
  const bool training = data.loss_fn != nullptr;
  c10::AutoGradMode grad_mode(training);
  auto& st = ctx.stages[k];
  Stage& stage = *stages_[k];
  if (training && schedule.weight_stashing) st.versions.begin(schedules::forward_versions(schedule)[k], stage);
  ActionTimer timer(streams_[k], options_.trace, ctx.start);

  const std::vector<size_t> no_barriers;
  const auto& barriers = schedule.barriers.empty() ? no_barriers : schedule.barriers[k];
  size_t next_barrier = 0;
  const auto meet_barriers = [&](size_t position) {
    for (; next_barrier < barriers.size() && barriers[next_barrier] == position; ++next_barrier) {
      transport_->barrier(k, static_cast<int>(next_barrier));
    }
  };

  const auto& actions = schedule.stages[k];
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& action = actions[i];
    meet_barriers(i);
    if (ctx.failed) throw AbortedError("aborted because another stage failed");
    st.wait_in = st.wait_out = 0;
    timer.begin();
    try {
      if (action.kind == ActionKind::kForward) {
        forward(k, action.microbatch, schedule, data, ctx);
      } else {
        backward(k, action.microbatch, schedule, data, ctx);
      }
    } catch (const AbortedError&) {
      throw;
    } catch (const DivergenceError&) {
      throw;
    } catch (const std::exception& e) {
      throw PipelineError(
          k, action.microbatch, action.str(),
          "conveyor: stage " + std::to_string(k) + " failed in " + describe(action) + ": " + message_of(e));
    }
    st.versions.note_peak();
    timer.end(action, st.wait_in, st.wait_out);
  }
  meet_barriers(actions.size());

  if (training && schedule.synchronous() && options_.divergence_guard) {
    check_finite(k, -1, "gradient", stage.gradients(), schedule, "");
  }
  if (streams_[k]) streams_[k]->synchronize();
  timer.finish();
  st.busy_seconds = timer.busy_seconds();
  st.trace = std::move(timer.trace());
}

void Runtime::check_finite(int k, int mb, const char* what, const std::vector<at::Tensor>& tensors,
                           const Schedule& schedule, const std::string& action) const {
  if (tensors.empty()) return;
  const int64_t bad = count_nonfinite(tensors).item<int64_t>();
  if (bad == 0) return;
  const int64_t step = completed_steps_ + 1;
  std::ostringstream os;
  os << "conveyor: training diverged at step " << step << " of schedule '" << schedule.name << "': stage " << k
     << " has a non-finite " << what << " (" << bad << " element" << (bad == 1 ? "" : "s") << ")";
  if (!action.empty()) os << " in " << action << " (micro-batch " << mb << ")";
  os << "; the weights of the last good step are kept";
  throw DivergenceError(step, schedule.name, k, mb, action, os.str());
}

void Runtime::forward(int k, int mb, const Schedule& schedule, const StepData& data, StepContext& ctx) {
  Stage& stage = *stages_[k];
  auto& st = ctx.stages[k];
  const bool training = data.loss_fn != nullptr;
  const bool last = k + 1 == num_stages();
  // With an inputs-only stash the forward builds no graph: its backward will.
  const bool inputs_only = training && schedule.stash == schedules::Stash::kInputs;
  const bool build_graph = training && !inputs_only;
  at::Tensor x = k == 0 ? data.inputs[mb].to(stage.device())
                        : waited(st.wait_in, [&] { return transport_->recv(Channel::kActivation, k - 1, k, mb); });
  const bool input_is_leaf = build_graph && k > 0 && x.defined() && x.is_floating_point();
  if (input_is_leaf) x = x.detach().requires_grad_(true);

  StashEntry entry;
  if (training && schedule.weight_stashing) {
    entry.weights = st.versions.for_forward(mb, st.updates);
    stage.read_weights(*entry.weights);
  }
  at::Tensor y;
  {
    c10::AutoGradMode grad_mode(build_graph);
    y = run_layers(stage, x, inputs_only ? &entry.random : nullptr);
  }
  if (!last) {
    waited(st.wait_out, [&] {
      transport_->send(Channel::kActivation, k, k + 1, mb, y.detach());
      return 0;
    });
  }
  if (!training) {
    if (last && ctx.outputs) (*ctx.outputs)[mb] = y;
    return;
  }

  at::Tensor root = y;
  if (last) {
    c10::AutoGradMode grad_mode(build_graph);
    const at::Tensor loss = loss_of(mb, y, data);
    if (options_.divergence_guard) {
      check_finite(k, mb, "loss", {loss.detach()}, schedule, Action{k, ActionKind::kForward, mb}.str());
    }
    const at::Tensor value = loss.detach() * data.report_weight[mb];
    st.loss_sum = st.loss_sum.defined() ? st.loss_sum + value : value;
    if (build_graph) root = loss * data.loss_scale[mb];
  }
  keep_for_backward(entry, inputs_only, x, input_is_leaf, y, root);
  st.stash.put(mb, std::move(entry));
}

at::Tensor Runtime::loss_of(int mb, const at::Tensor& output, const StepData& data) const {
  const at::Tensor loss = (*data.loss_fn)(output, data.targets[mb].to(output.device()));
  TORCH_CHECK(loss.defined() && loss.numel() == 1, "the loss function must return a single-element tensor, got ",
              loss.defined() ? loss.sizes() : at::IntArrayRef{}, " for micro-batch ", mb);
  return loss.reshape({});
}

at::Tensor Runtime::replay_forward(int k, int mb, StashEntry& entry, const StepData& data) {
  const Stage& stage = *stages_[k];
  if (k > 0 && entry.input.defined() && entry.input.is_floating_point()) {
    entry.input = entry.input.detach().requires_grad_(true);
  }
  at::Tensor y;
  if (entry.random) {  // set only with the stage's own streams
    stage.random()->replay(*entry.random, [&] { y = stage.forward(entry.input); });
  } else {
    y = stage.forward(entry.input);
  }
  return k + 1 == num_stages() ? loss_of(mb, y, data) * data.loss_scale[mb] : y;
}

void Runtime::backward(int k, int mb, const Schedule& schedule, const StepData& data, StepContext& ctx) {
  Stage& stage = *stages_[k];
  auto& st = ctx.stages[k];
  StashEntry entry = st.stash.take(mb);
  if (entry.weights) {
    stage.read_weights(*entry.weights);
  } else {
    stage.read_live_weights();
  }
  const at::Tensor root = entry.inputs_only ? replay_forward(k, mb, entry, data) : entry.root;
  if (k + 1 == num_stages()) {
    torch::autograd::backward({root});
  } else {
    const at::Tensor grad = waited(st.wait_in, [&] { return transport_->recv(Channel::kGradient, k + 1, k, mb); });
    // An undefined gradient means nothing downstream depended on our output.
    if (grad.defined() && root.requires_grad()) torch::autograd::backward({root}, {grad});
  }
  if (k > 0) {
    const at::Tensor& input = entry.input;
    const bool has_grad = input.defined() && input.requires_grad();
    waited(st.wait_out, [&] {
      transport_->send(Channel::kGradient, k, k - 1, mb, has_grad ? input.grad() : at::Tensor());
      return 0;
    });
  }
  if (schedule.step_per_microbatch) optimizer_step(k, mb, schedule, ctx);
}

void Runtime::optimizer_step(int k, int mb, const Schedule& schedule, StepContext& ctx) {
  Stage& stage = *stages_[k];
  auto& st = ctx.stages[k];
  stage.collect_gradients();
  if (options_.divergence_guard) {
    check_finite(k, mb, "gradient", stage.gradients(), schedule, Action{k, ActionKind::kBackward, mb}.str());
  }
  TORCH_CHECK(stage.optimizer(), "schedule '", schedule.name,
              "' steps the optimizer after every micro-batch, but the pipeline has none (PipelineOptions::optimizer)");
  stage.step(options_.learning_rate ? options_.learning_rate(stage.updates()) : -1.0);
  ++st.updates;
  st.versions.after_update(st.updates, stage);
}

}  // namespace conveyor
