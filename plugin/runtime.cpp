#include "plugin/runtime.h"

#include "plugin/errors.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/GradMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <sstream>

namespace conveyor {

using schedules::Action;
using schedules::ActionKind;
using Clock = std::chrono::steady_clock;

namespace {

struct StashEntry {
  at::Tensor input;   // the stage's input (a leaf that requires grad on stages > 0)
  at::Tensor output;  // the stage's output, or the weighted loss on the last stage
  int64_t bytes = 0;
};

int64_t tensor_bytes(const at::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size()) : 0;
}

std::string describe(const Action& a) {
  std::ostringstream os;
  os << a.str() << " (" << (a.kind == ActionKind::kForward ? "forward" : "backward") << " of micro-batch "
     << a.microbatch << ")";
  return os.str();
}

std::string message_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

}  // namespace

struct Runtime::StepContext {
  struct PerStage {
    std::map<int, StashEntry> stash;
    int64_t live_bytes = 0, peak_bytes = 0;
    int live = 0, peak = 0;
    double busy_seconds = 0;
    std::vector<TraceEvent> trace;
    at::Tensor loss_sum;
  };
  explicit StepContext(int k) : stages(k) {}
  std::vector<PerStage> stages;
  std::vector<at::Tensor>* outputs = nullptr;
  Clock::time_point start = Clock::now();
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr first_error;
};

Runtime::Runtime(std::vector<std::shared_ptr<Stage>> stages, std::unique_ptr<Transport> transport, bool trace)
    : stages_(std::move(stages)),
      transport_(std::move(transport)),
      streams_(stages_.size()),
      trace_(trace),
      workers_(static_cast<int>(stages_.size())) {
  // Each stage on an accelerator computes on its own stream, so stages that
  // share a device can overlap and copies can overlap compute.
  for (size_t k = 0; k < stages_.size(); ++k) {
    const c10::Device& d = stages_[k]->device();
    if (!d.is_cpu()) streams_[k] = c10::impl::VirtualGuardImpl(d.type()).getStreamFromGlobalPool(d);
  }
}

StepResult Runtime::run(const schedules::Schedule& schedule, const StepData& data,
                        std::vector<at::Tensor>* outputs) {
  const int num = num_stages();
  TORCH_CHECK(schedule.num_stages == num, "conveyor: schedule has ", schedule.num_stages, " stages, pipeline has ", num);
  TORCH_CHECK(static_cast<int>(data.inputs.size()) == schedule.num_microbatches, "conveyor: ", data.inputs.size(),
              " micro-batches given to a schedule of ", schedule.num_microbatches);
  transport_->reset();
  StepContext ctx(num);
  ctx.outputs = outputs;
  if (outputs) outputs->assign(data.inputs.size(), at::Tensor());

  const std::vector<std::exception_ptr> errors = workers_.run([&](int k) {
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
  if (ctx.first_error) std::rethrow_exception(ctx.first_error);
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);  // an abort with no first error cannot happen; be loud if it does
  }

  StepResult result;
  result.wall_seconds = wall;
  double busy_total = 0;
  for (int k = 0; k < num; ++k) {
    auto& st = ctx.stages[k];
    result.busy_seconds.push_back(st.busy_seconds);
    result.peak_inflight.push_back(st.peak);
    result.peak_stash_bytes.push_back(st.peak_bytes);
    result.trace.push_back(std::move(st.trace));
    busy_total += st.busy_seconds;
  }
  result.bubble_fraction = wall > 0 ? std::max(0.0, 1.0 - busy_total / (num * wall)) : 0.0;
  const auto& loss_sum = ctx.stages.back().loss_sum;
  if (loss_sum.defined()) result.loss = loss_sum.item<double>();
  return result;
}

void Runtime::run_stage(int k, const schedules::Schedule& schedule, const StepData& data, StepContext& ctx) {
  std::optional<c10::StreamGuard> stream_guard;
  if (streams_[k]) stream_guard.emplace(*streams_[k]);
  c10::AutoGradMode grad_mode(data.loss_fn != nullptr);
  auto& st = ctx.stages[k];

  // On an accelerator, action times come from events on the stage's stream
  // (the host only queues work); on the CPU the host clock is the truth.
  const bool device_timing = streams_[k].has_value() && trace_;
  const double base_us = std::chrono::duration<double, std::micro>(Clock::now() - ctx.start).count();
  std::optional<c10::Event> origin;
  std::vector<std::pair<c10::Event, c10::Event>> events;
  if (device_timing) {
    origin.emplace(streams_[k]->device_type(), c10::EventFlag::BACKEND_DEFAULT);
    origin->record(*streams_[k]);
  }

  for (const Action& action : schedule.stages[k]) {
    if (ctx.failed) throw AbortedError("aborted because another stage failed");
    const auto t0 = Clock::now();
    if (device_timing) {
      events.emplace_back(c10::Event(streams_[k]->device_type(), c10::EventFlag::BACKEND_DEFAULT),
                          c10::Event(streams_[k]->device_type(), c10::EventFlag::BACKEND_DEFAULT));
      events.back().first.record(*streams_[k]);
    }
    try {
      if (action.kind == ActionKind::kForward) {
        forward(k, action.microbatch, data, ctx);
      } else {
        backward(k, action.microbatch, ctx);
      }
    } catch (const AbortedError&) {
      throw;
    } catch (const std::exception& e) {
      throw PipelineError(k, action.microbatch, action.str(),
                          "conveyor: stage " + std::to_string(k) + " failed in " + describe(action) + ": " +
                              message_of(e));
    }
    if (device_timing) {
      events.back().second.record(*streams_[k]);
    } else {
      const auto t1 = Clock::now();
      st.busy_seconds += std::chrono::duration<double>(t1 - t0).count();
      if (trace_) {
        st.trace.push_back(TraceEvent{action, std::chrono::duration<double, std::micro>(t0 - ctx.start).count(),
                                      std::chrono::duration<double, std::micro>(t1 - ctx.start).count()});
      }
    }
  }
  if (streams_[k]) streams_[k]->synchronize();
  if (device_timing) {
    for (size_t i = 0; i < events.size(); ++i) {
      const double s = base_us + 1000.0 * origin->elapsedTime(events[i].first);
      const double e = base_us + 1000.0 * origin->elapsedTime(events[i].second);
      st.busy_seconds += (e - s) * 1e-6;
      st.trace.push_back(TraceEvent{schedule.stages[k][i], s, e});
    }
  }
}

void Runtime::forward(int k, int mb, const StepData& data, StepContext& ctx) {
  const Stage& stage = *stages_[k];
  const bool training = data.loss_fn != nullptr;
  const bool last = k + 1 == num_stages();
  at::Tensor x = k == 0 ? data.inputs[mb].to(stage.device()) : transport_->recv(Channel::kActivation, k - 1, k, mb);
  if (training && k > 0 && x.defined() && x.is_floating_point()) x = x.detach().requires_grad_(true);
  at::Tensor y = stage.forward(x);

  if (!last) transport_->send(Channel::kActivation, k, k + 1, mb, y.detach());
  if (!training) {
    if (last && ctx.outputs) (*ctx.outputs)[mb] = y;
    return;
  }
  auto& st = ctx.stages[k];
  StashEntry entry{k > 0 ? x : at::Tensor(), y, 0};
  entry.bytes = tensor_bytes(entry.input) + tensor_bytes(y);
  if (last) {
    at::Tensor loss = (*data.loss_fn)(y, data.targets[mb].to(stage.device()));
    TORCH_CHECK(loss.defined() && loss.numel() == 1, "the loss function must return a single-element tensor, got ",
                loss.defined() ? loss.sizes() : at::IntArrayRef{}, " for micro-batch ", mb);
    entry.output = loss.reshape({}) * data.loss_weights[mb];
    const at::Tensor value = entry.output.detach();
    st.loss_sum = st.loss_sum.defined() ? st.loss_sum + value : value;
  }
  st.live_bytes += entry.bytes;
  st.peak_bytes = std::max(st.peak_bytes, st.live_bytes);
  st.peak = std::max(st.peak, ++st.live);
  st.stash.insert_or_assign(mb, std::move(entry));
}

void Runtime::backward(int k, int mb, StepContext& ctx) {
  auto& st = ctx.stages[k];
  auto it = st.stash.find(mb);
  TORCH_CHECK(it != st.stash.end(), "no stashed forward for micro-batch ", mb);
  StashEntry entry = std::move(it->second);
  st.stash.erase(it);
  st.live_bytes -= entry.bytes;
  --st.live;

  const bool last = k + 1 == num_stages();
  if (last) {
    torch::autograd::backward({entry.output});
  } else {
    const at::Tensor grad = transport_->recv(Channel::kGradient, k + 1, k, mb);
    // An undefined gradient means nothing downstream depended on our output.
    if (grad.defined() && entry.output.requires_grad()) torch::autograd::backward({entry.output}, {grad});
  }
  if (k > 0) {
    const bool has_grad = entry.input.defined() && entry.input.requires_grad();
    transport_->send(Channel::kGradient, k, k - 1, mb, has_grad ? entry.input.grad() : at::Tensor());
  }
}

}  // namespace conveyor
