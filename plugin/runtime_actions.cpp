// The runtime's actions: a stage's forward and backward of one micro-batch,
// what crosses to its neighbours, the optimizer step after a backward, and
// the tied parameters' sums. runtime.cpp runs the step that calls them.
#include "plugin/errors.h"
#include "plugin/fault_injection.h"
#include "plugin/runtime.h"
#include "plugin/step_context.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

namespace conveyor {

using schedules::Action;
using schedules::ActionKind;
using schedules::Schedule;

namespace {

// Runs the stage's layers, under its own random streams when it has them;
// `start` (if given) receives where the streams stood, for a replay, and
// `outputs` (if given) every layer's outputs.
Tensors run_layers(const Stage& stage, Tensors x, std::optional<StageRandom::State>* start,
                   std::vector<Tensors>* outputs) {
  StageRandom* random = stage.random();
  if (!random) return stage.forward(std::move(x), outputs);
  if (start) *start = random->state();
  Tensors y;
  random->run([&] { y = stage.forward(std::move(x), outputs); });
  return y;
}

// The grad-requiring tensors of `tensors`, slot by slot (the others undefined).
Tensors requiring_grad(const Tensors& tensors) {
  Tensors out(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].defined() && tensors[i].requires_grad()) out[i] = tensors[i];
  }
  return out;
}

Tensors detached(const Tensors& tensors) {
  Tensors out(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].defined()) out[i] = tensors[i].detach();
  }
  return out;
}

// A stage after the first differentiates its floating inputs: each becomes a
// leaf whose gradient goes back to the previous stage.
void make_input_leaves(Tensors& x) {
  for (auto& t : x) {
    if (t.defined() && t.is_floating_point()) t = t.detach().requires_grad_(true);
  }
}

// What a forward leaves for its backward, as the schedule declares: the
// graph (the grad-requiring inputs and the roots to differentiate), or only
// the inputs, from which the backward replays the forward.
void keep_for_backward(StashEntry& entry, bool inputs_only, Tensors& inputs, const Tensors& outputs, Tensors roots) {
  entry.inputs_only = inputs_only;
  if (inputs_only) {
    entry.inputs = std::move(inputs);
    entry.bytes = tensor_bytes(entry.inputs);
  } else {
    entry.inputs = requiring_grad(inputs);
    entry.roots = std::move(roots);
    entry.bytes = tensor_bytes(entry.inputs) + tensor_bytes(outputs);
  }
}

}  // namespace

void Runtime::forward(int k, int mb, const Schedule& schedule, const StepData& data, StepContext& ctx) {
  Stage& stage = *stages_[k];
  auto& st = ctx.stages[k];
  const bool training = data.loss_fn != nullptr;
  const bool last = k + 1 == num_stages();
  // With an inputs-only stash the forward builds no graph: its backward will.
  const bool inputs_only = training && schedules::replays_forward(schedule.stash);
  const bool build_graph = training && !inputs_only;
  Tensors x;
  if (k == 0) {
    x = data.inputs[mb];
    for (auto& t : x) {
      if (t.defined()) t = t.to(stage.device());
    }
  } else {
    x = waited(st.wait_in, st.blocked, [&] { return transport_->recv(Channel::kActivation, k - 1, k, mb); });
    if (build_graph) make_input_leaves(x);
  }

  StashEntry entry;
  if (training && schedule.weight_stashing) {
    entry.weights = st.versions.for_forward(mb, st.updates);
    stage.read_weights(*entry.weights);
  }
  Tensors y;
  {
    c10::AutoGradMode grad_mode(build_graph);
    // A split backward differentiates layer by layer: keep every layer's outputs.
    std::vector<Tensors>* layer_outputs = build_graph && schedule.splits_backward() ? &entry.layer_outputs : nullptr;
    y = run_layers(stage, training ? x : std::move(x), inputs_only ? &entry.random : nullptr, layer_outputs);
  }
  if (!last) {
    waited(st.wait_out, st.blocked, [&] {
      transport_->send(Channel::kActivation, k, k + 1, mb, detached(y));
      return 0;
    });
  }
  if (!training) {
    if (last && ctx.outputs) (*ctx.outputs)[mb] = std::move(y);
    return;
  }

  Tensors roots;
  if (last) {
    c10::AutoGradMode grad_mode(build_graph);
    at::Tensor loss = loss_of(mb, y, data);
    if (FaultInjector* faults = fault_injector()) loss = faults->on_loss(k, mb, loss);
    if (options_.divergence_guard) {
      check_finite(k, mb, "loss", {loss.detach()}, schedule, Action{k, ActionKind::kForward, mb}.str());
    }
    const at::Tensor value = loss.detach() * data.report_weight[mb];
    st.loss_sum = st.loss_sum.defined() ? st.loss_sum + value : value;
    if (build_graph) roots = {loss * data.loss_scale[mb]};
  } else if (build_graph) {
    roots = requiring_grad(y);
  }
  keep_for_backward(entry, inputs_only, x, y, std::move(roots));
  if (schedule.stash == schedules::Stash::kOffload) offload(k, entry);
  st.stash.put(mb, std::move(entry));
}

at::Tensor Runtime::loss_of(int mb, const Tensors& outputs, const StepData& data) const {
  Tensors targets = data.targets[mb];
  const c10::Device device = [&] {
    for (const auto& t : outputs) {
      if (t.defined()) return t.device();
    }
    return c10::Device(c10::kCPU);
  }();
  for (auto& t : targets) {
    if (t.defined()) t = t.to(device);
  }
  const at::Tensor loss = (*data.loss_fn)(outputs, targets);
  TORCH_CHECK(loss.defined() && loss.numel() == 1, "the loss function must return a single-element tensor, got ",
              loss.defined() ? loss.sizes() : at::IntArrayRef{}, " for micro-batch ", mb);
  return loss.reshape({});
}

Tensors Runtime::replay_forward(int k, int mb, StashEntry& entry, const StepData& data, bool keep_layer_outputs) {
  const Stage& stage = *stages_[k];
  bring_back(k, entry);
  if (k > 0) make_input_leaves(entry.inputs);
  std::vector<Tensors>* outputs = keep_layer_outputs ? &entry.layer_outputs : nullptr;
  Tensors y;
  if (entry.random) {  // set only with the stage's own streams
    stage.random()->replay(*entry.random, [&] { y = stage.forward(entry.inputs, outputs); });
  } else {
    y = stage.forward(entry.inputs, outputs);
  }
  if (k + 1 == num_stages()) return {loss_of(mb, y, data) * data.loss_scale[mb]};
  return requiring_grad(y);
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
  const Tensors roots = entry.inputs_only ? replay_forward(k, mb, entry, data, false) : std::move(entry.roots);
  if (k + 1 == num_stages()) {
    torch::autograd::backward(roots);
  } else {
    // An undefined gradient means nothing downstream depended on that output.
    const Tensors grads = receive_gradients(k, mb, roots, ctx);
    Tensors outputs, output_grads;
    for (size_t i = 0; i < roots.size(); ++i) {
      if (!roots[i].defined() || !grads[i].defined()) continue;
      outputs.push_back(roots[i]);
      output_grads.push_back(grads[i]);
    }
    if (!outputs.empty()) torch::autograd::backward(outputs, output_grads);
  }
  if (k > 0) {
    Tensors input_grads(entry.inputs.size());
    for (size_t i = 0; i < entry.inputs.size(); ++i) {
      const at::Tensor& input = entry.inputs[i];
      if (input.defined() && input.requires_grad()) input_grads[i] = input.grad();
    }
    send_input_gradients(k, mb, input_grads, ctx);
  }
  if (schedule.step_per_microbatch) optimizer_step(k, mb, schedule, ctx);
}

Tensors Runtime::receive_gradients(int k, int mb, const Tensors& roots, StepContext& ctx) {
  const Tensors grads =
      waited(ctx.stages[k].wait_in, ctx.stages[k].blocked, [&] { return transport_->recv(Channel::kGradient, k + 1, k, mb); });
  TORCH_CHECK(grads.size() == roots.size(), "stage ", k + 1, " sent ", grads.size(), " gradient",
              grads.size() == 1 ? "" : "s", " for the ", roots.size(), " tensor", roots.size() == 1 ? "" : "s",
              " stage ", k, " passed it");
  return grads;
}

void Runtime::send_input_gradients(int k, int mb, const Tensors& grads, StepContext& ctx) {
  waited(ctx.stages[k].wait_out, ctx.stages[k].blocked, [&] {
    transport_->send(Channel::kGradient, k, k - 1, mb, grads);
    return 0;
  });
}

namespace {

// The distinct stages that hold a tied parameter, ascending, and whether
// this process runs any or all of them.
struct TieHolders {
  std::vector<int> stages;
  bool any_local = false, all_local = true;
};

TieHolders holders_of(const TiedParameter& tie, const Runtime& runtime) {
  TieHolders h;
  for (const auto& [k, i] : tie) {
    if (h.stages.empty() || h.stages.back() != k) h.stages.push_back(k);
    if (runtime.is_local(k)) {
      h.any_local = true;
    } else {
      h.all_local = false;
    }
  }
  return h;
}

}  // namespace

void Runtime::unify_tied_values() {
  c10::NoGradGuard no_grad;
  for (size_t t = 0; t < ties_.size(); ++t) {
    const TiedParameter& tie = ties_[t];
    const TieHolders h = holders_of(tie, *this);
    if (!h.any_local) continue;
    at::Tensor value;  // the first holder's
    if (h.all_local) {
      value = stages_[tie.front().first]->live()[tie.front().second];
    } else {
      for (const auto& [k, i] : tie) {
        if (!is_local(k)) continue;
        value = transport_->first_holders_value(static_cast<int>(t), h.stages, stages_[k]->live()[i]);
        break;
      }
    }
    for (const auto& [k, i] : tie) {
      if (!is_local(k)) continue;
      const at::Tensor& w = stages_[k]->live()[i];
      if (!w.is_same(value)) w.copy_(value);
    }
  }
}

std::vector<Tensors> Runtime::take_tied_gradients() {
  std::vector<Tensors> before(ties_.size());
  for (size_t t = 0; t < ties_.size(); ++t) {
    for (const auto& [k, i] : ties_[t]) {
      if (!is_local(k)) continue;
      at::Tensor w = stages_[k]->live()[i];
      before[t].push_back(w.grad());
      w.mutable_grad() = at::Tensor();
    }
  }
  return before;
}

void Runtime::add_back_tied_gradients(const std::vector<Tensors>& before) {
  for (size_t t = 0; t < ties_.size(); ++t) {
    size_t n = 0;
    for (const auto& [k, i] : ties_[t]) {
      if (!is_local(k)) continue;
      at::Tensor w = stages_[k]->live()[i];
      const at::Tensor& held = before[t][n++];
      if (held.defined()) w.mutable_grad() = w.grad().defined() ? held + w.grad() : held;
    }
  }
}

void Runtime::sum_tied_gradients(const std::vector<Tensors>& before) {
  for (size_t t = 0; t < ties_.size(); ++t) {
    const TiedParameter& tie = ties_[t];
    const TieHolders h = holders_of(tie, *this);
    if (!h.any_local) continue;
    at::Tensor sum;  // the local holders' gradients of this step, in stage order
    for (const auto& [k, i] : tie) {
      if (!is_local(k)) continue;
      const at::Tensor& w = stages_[k]->live()[i];
      const at::Tensor g = w.grad().defined() ? w.grad() : at::zeros_like(w);
      sum = sum.defined() ? sum + g.to(sum.device()) : g.clone();
    }
    if (!h.all_local) sum = transport_->sum_over_holders(static_cast<int>(t), h.stages, sum);
    size_t n = 0;
    for (const auto& [k, i] : tie) {
      if (!is_local(k)) continue;
      at::Tensor w = stages_[k]->live()[i];
      const at::Tensor& held = before[t][n++];
      const at::Tensor mine = sum.to(w.device(), /*non_blocking=*/false, /*copy=*/true);
      w.mutable_grad() = held.defined() ? held + mine : mine;
    }
  }
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
