#include "plugin/runtime.h"

#include "ops/nonfinite/nonfinite.h"
#include "plugin/errors.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/GradMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/serialize/archive.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <sstream>

namespace conveyor {

using schedules::Action;
using schedules::ActionKind;
using schedules::Schedule;
using Clock = std::chrono::steady_clock;

namespace {

// What a stage keeps for one in-flight micro-batch.
struct StashEntry {
  at::Tensor input;   // the stage's input: a grad-requiring leaf, or (replay) the plain input
  at::Tensor output;  // the stage's output (or the scaled loss on the last stage); undefined when replaying
  std::shared_ptr<WeightVersion> weights;  // the version the forward read (weight stashing)
  std::optional<StageRandom::State> random;  // where the stage's streams stood (replay with stage_rng)
  int64_t bytes = 0;
};

int64_t tensor_bytes(const at::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size()) : 0;
}

std::string describe(const Action& a) {
  std::ostringstream os;
  os << a.str() << " (" << schedules::kind_name(a.kind) << " of micro-batch " << a.microbatch << ")";
  return os.str();
}

std::string message_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
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

std::string save_optimizer(const torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void load_optimizer(torch::optim::Optimizer& optimizer, const std::string& bytes) {
  torch::serialize::InputArchive archive;
  std::istringstream in(bytes);
  archive.load_from(in);
  optimizer.load(archive);
}

}  // namespace

struct Runtime::StepContext {
  struct PerStage {
    std::map<int, StashEntry> stash;
    int64_t live_bytes = 0, peak_bytes = 0;
    int live = 0, peak = 0, activations = 0, peak_activations = 0, inputs = 0, peak_inputs = 0;
    double busy_seconds = 0;
    // Seconds the current action spent blocked in the transport before and
    // after its compute: not busy time.
    double wait_in = 0, wait_out = 0;
    std::vector<TraceEvent> trace;
    at::Tensor loss_sum;
    // Weight stashing: the version each forward reads, the versions some
    // forward still needs, and every version made (to count the live ones).
    std::vector<int> forward_version;
    std::map<int, int> readers_left;
    std::map<int, std::shared_ptr<WeightVersion>> versions;
    std::vector<std::weak_ptr<WeightVersion>> made;
    int peak_versions = 0;
    int updates = 0;

    int live_versions() const {
      int n = 0;
      for (const auto& w : made) n += w.expired() ? 0 : 1;
      return n;
    }
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
  TORCH_CHECK(schedule.num_stages == num, "conveyor: schedule has ", schedule.num_stages, " stages, pipeline has ", num);
  TORCH_CHECK(static_cast<int>(data.inputs.size()) == schedule.num_microbatches, "conveyor: ", data.inputs.size(),
              " micro-batches given to a schedule of ", schedule.num_microbatches);
  const bool training = data.loss_fn != nullptr;
  transport_->reset();
  StepContext ctx(num);
  ctx.outputs = outputs;
  if (outputs) outputs->assign(data.inputs.size(), at::Tensor());

  // An asynchronous step updates as it goes: keep what a rollback needs.
  std::map<int, std::pair<std::shared_ptr<WeightVersion>, std::string>> last_good;
  if (training && !schedule.synchronous()) {
    for (int k : local_) {
      last_good[k] = {stages_[k]->snapshot(),
                      stages_[k]->optimizer() ? save_optimizer(*stages_[k]->optimizer()) : std::string()};
    }
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
  const double wall = std::chrono::duration<double>(Clock::now() - ctx.start).count();
  for (int k : local_) stages_[k]->read_live_weights();
  std::exception_ptr error = ctx.first_error;
  for (const auto& e : errors) {
    if (!error && e) error = e;  // an abort with no first error cannot happen; be loud if it does
  }
  if (error) {
    // An asynchronous step has updated part-way: go back to the last good
    // step, whatever failed, so that nothing half-done survives.
    for (auto& [k, saved] : last_good) {
      stages_[k]->restore_live(*saved.first);
      if (!saved.second.empty()) load_optimizer(*stages_[k]->optimizer(), saved.second);
    }
    if (!last_good.empty() || is_divergence(error)) {
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
    result.peak_inflight.push_back(st.peak);
    result.peak_stash_bytes.push_back(st.peak_bytes);
    result.peak_stashed_activations.push_back(st.peak_activations);
    result.peak_stashed_inputs.push_back(st.peak_inputs);
    result.peak_weight_versions.push_back(st.peak_versions);
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

  if (training && schedule.weight_stashing) {
    st.forward_version = schedules::forward_versions(schedule)[k];
    for (int v : st.forward_version) ++st.readers_left[v];
    if (st.readers_left.count(0)) {
      st.versions[0] = stage.snapshot();
      st.made.push_back(st.versions[0]);
    }
  }

  // On an accelerator, action times come from events on the stage's stream
  // (the host only queues work); on the CPU the host clock is the truth.
  const bool device_timing = streams_[k].has_value() && options_.trace;
  const double base_us = std::chrono::duration<double, std::micro>(Clock::now() - ctx.start).count();
  std::optional<c10::Event> origin;
  std::vector<std::pair<c10::Event, c10::Event>> events;
  if (device_timing) {
    origin.emplace(streams_[k]->device_type(), c10::EventFlag::BACKEND_DEFAULT);
    origin->record(*streams_[k]);
  }

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
    const auto t0 = Clock::now();
    if (device_timing) {
      events.emplace_back(c10::Event(streams_[k]->device_type(), c10::EventFlag::BACKEND_DEFAULT),
                          c10::Event(streams_[k]->device_type(), c10::EventFlag::BACKEND_DEFAULT));
      events.back().first.record(*streams_[k]);
    }
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
      throw PipelineError(k, action.microbatch, action.str(),
                          "conveyor: stage " + std::to_string(k) + " failed in " + describe(action) + ": " +
                              message_of(e));
    }
    st.peak_versions = std::max(st.peak_versions, st.live_versions());
    if (device_timing) {
      events.back().second.record(*streams_[k]);
    } else {
      const auto t1 = Clock::now();
      const double start_us = std::chrono::duration<double, std::micro>(t0 - ctx.start).count() + st.wait_in * 1e6;
      const double end_us =
          std::max(start_us, std::chrono::duration<double, std::micro>(t1 - ctx.start).count() - st.wait_out * 1e6);
      st.busy_seconds += (end_us - start_us) * 1e-6;
      if (options_.trace) st.trace.push_back(TraceEvent{action, start_us, end_us});
    }
  }
  meet_barriers(actions.size());

  if (training && schedule.synchronous() && options_.divergence_guard) {
    std::vector<at::Tensor> grads;
    for (const auto& w : stage.live()) {
      if (w.grad().defined()) grads.push_back(w.grad());
    }
    check_finite(k, -1, "gradient", grads, schedule, "");
  }
  if (streams_[k]) streams_[k]->synchronize();
  if (device_timing) {
    for (size_t i = 0; i < events.size(); ++i) {
      const double s = base_us + 1000.0 * origin->elapsedTime(events[i].first);
      const double e = base_us + 1000.0 * origin->elapsedTime(events[i].second);
      st.busy_seconds += (e - s) * 1e-6;
      st.trace.push_back(TraceEvent{actions[i], s, e});
    }
  }
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
  const bool replay = training && schedule.stash == schedules::Stash::kInputs;
  const bool last = k + 1 == num_stages();
  at::Tensor x = k == 0 ? data.inputs[mb].to(stage.device())
                        : waited(st.wait_in, [&] { return transport_->recv(Channel::kActivation, k - 1, k, mb); });
  const bool input_needs_grad = training && !replay && k > 0 && x.defined() && x.is_floating_point();
  if (input_needs_grad) x = x.detach().requires_grad_(true);

  StashEntry entry;
  if (training && schedule.weight_stashing) {
    const int v = st.forward_version.at(mb);
    const auto it = st.versions.find(v);
    TORCH_CHECK(it != st.versions.end(), "weight version ", v, " is not available (this stage has made ", st.updates,
                " updates)");
    entry.weights = it->second;
    if (--st.readers_left[v] == 0) st.versions.erase(it);
    stage.read_weights(*entry.weights);
  }
  at::Tensor y;
  {
    c10::AutoGradMode grad_mode(training && !replay);
    if (StageRandom* random = stage.random()) {
      if (replay) entry.random = random->state();
      random->run([&] { y = stage.forward(x); });
    } else {
      y = stage.forward(x);
    }
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

  entry.input = (input_needs_grad || replay) ? x : at::Tensor();
  entry.output = replay ? at::Tensor() : y;
  if (last) {
    at::Tensor loss;
    {
      c10::AutoGradMode grad_mode(!replay);
      loss = (*data.loss_fn)(y, data.targets[mb].to(stage.device()));
    }
    TORCH_CHECK(loss.defined() && loss.numel() == 1, "the loss function must return a single-element tensor, got ",
                loss.defined() ? loss.sizes() : at::IntArrayRef{}, " for micro-batch ", mb);
    loss = loss.reshape({});
    if (options_.divergence_guard) {
      check_finite(k, mb, "loss", {loss.detach()}, schedule, Action{k, ActionKind::kForward, mb}.str());
    }
    const at::Tensor value = loss.detach() * data.report_weight[mb];
    st.loss_sum = st.loss_sum.defined() ? st.loss_sum + value : value;
    if (!replay) entry.output = loss * data.loss_scale[mb];
  }
  entry.bytes = tensor_bytes(entry.input) + (replay ? 0 : tensor_bytes(y));
  st.live_bytes += entry.bytes;
  st.peak_bytes = std::max(st.peak_bytes, st.live_bytes);
  st.peak = std::max(st.peak, ++st.live);
  if (replay) {
    st.peak_inputs = std::max(st.peak_inputs, ++st.inputs);
  } else {
    st.peak_activations = std::max(st.peak_activations, ++st.activations);
  }
  st.stash.insert_or_assign(mb, std::move(entry));
}

void Runtime::backward(int k, int mb, const Schedule& schedule, const StepData& data, StepContext& ctx) {
  Stage& stage = *stages_[k];
  auto& st = ctx.stages[k];
  auto it = st.stash.find(mb);
  TORCH_CHECK(it != st.stash.end(), "no stashed forward for micro-batch ", mb);
  StashEntry entry = std::move(it->second);
  st.stash.erase(it);
  const bool replay = schedule.stash == schedules::Stash::kInputs;
  st.live_bytes -= entry.bytes;
  --st.live;
  --(replay ? st.inputs : st.activations);

  const bool last = k + 1 == num_stages();
  if (entry.weights) {
    stage.read_weights(*entry.weights);
  } else {
    stage.read_live_weights();
  }
  at::Tensor input = entry.input, root = entry.output;
  if (replay) {
    // Features replay: the forward again, from the kept input, now with grad.
    if (k > 0 && input.defined() && input.is_floating_point()) input = input.detach().requires_grad_(true);
    at::Tensor y;
    if (entry.random) {  // set only with the stage's own streams
      stage.random()->replay(*entry.random, [&] { y = stage.forward(input); });
    } else {
      y = stage.forward(input);
    }
    root = last ? (*data.loss_fn)(y, data.targets[mb].to(stage.device())).reshape({}) * data.loss_scale[mb] : y;
  }
  if (last) {
    torch::autograd::backward({root});
  } else {
    const at::Tensor grad =
        waited(st.wait_in, [&] { return transport_->recv(Channel::kGradient, k + 1, k, mb); });
    // An undefined gradient means nothing downstream depended on our output.
    if (grad.defined() && root.requires_grad()) torch::autograd::backward({root}, {grad});
  }
  if (k > 0) {
    const bool has_grad = input.defined() && input.requires_grad();
    waited(st.wait_out, [&] {
      transport_->send(Channel::kGradient, k, k - 1, mb, has_grad ? input.grad() : at::Tensor());
      return 0;
    });
  }
  if (schedule.step_per_microbatch) update(k, mb, schedule, ctx);
}

// The optimizer step after a backward (asynchronous schedules).
void Runtime::update(int k, int mb, const Schedule& schedule, StepContext& ctx) {
  Stage& stage = *stages_[k];
  auto& st = ctx.stages[k];
  stage.collect_gradients();
  if (options_.divergence_guard) {
    std::vector<at::Tensor> grads;
    for (const auto& w : stage.live()) {
      if (w.grad().defined()) grads.push_back(w.grad());
    }
    check_finite(k, mb, "gradient", grads, schedule, Action{k, ActionKind::kBackward, mb}.str());
  }
  TORCH_CHECK(stage.optimizer(), "schedule '", schedule.name,
              "' steps the optimizer after every micro-batch, but the pipeline has none (PipelineOptions::optimizer)");
  stage.step(options_.learning_rate ? options_.learning_rate(stage.updates()) : -1.0);
  ++st.updates;
  if (schedule.weight_stashing && st.readers_left.count(st.updates) && st.readers_left[st.updates] > 0) {
    st.versions[st.updates] = stage.snapshot();
    st.made.push_back(st.versions[st.updates]);
  }
}

}  // namespace conveyor
