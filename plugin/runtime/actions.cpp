// The runtime's actions: a stage's forward and backward of one micro-batch,
// and what crosses to its neighbours. runtime.cpp runs the step that calls
// them; split_backward.cpp holds the I and W of a split backward.
#include "plugin/core/errors.h"
#include "plugin/runtime/autocast.h"
#include "plugin/support/fault_injection.h"
#include "plugin/runtime/runtime.h"
#include "plugin/runtime/step_context.h"
#include "plugin/support/tensors.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>

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

// Outputs another process or device has its own copy of: for each one the
// backward reaches through its graph (not a leaf), only where it enters the
// graph is kept (`edges`, per slot); the tensor, a view or not, is dropped
// here, and its memory freed once nothing else holds it (the message until
// it is delivered, an operation that saved its result). Outputs that need no
// gradient are dropped too: no backward reads them.
void release_sent(Tensors& outputs, std::vector<torch::autograd::Edge>& edges) {
  edges.assign(outputs.size(), torch::autograd::Edge());
  for (size_t i = 0; i < outputs.size(); ++i) {
    at::Tensor& t = outputs[i];
    if (!t.defined() || (t.requires_grad() && t.grad_fn() == nullptr)) continue;
    if (t.requires_grad()) edges[i] = torch::autograd::impl::gradient_edge(t);
    t = at::Tensor();
  }
}

// The backward from where `roots` (or, for an undefined one, its `released`
// edge) enter the graph, with `grads`, slot by slot (an undefined gradient
// skips its slot), through the engine directly: the gradients' shapes are
// checked against those the graph recorded.
void backward_through_graph(const Tensors& roots, const std::vector<torch::autograd::Edge>& released,
                            const Tensors& grads) {
  torch::autograd::edge_list edges;
  torch::autograd::variable_list values;
  for (size_t i = 0; i < roots.size(); ++i) {
    if (!grads[i].defined()) continue;
    if (roots[i].defined()) {
      edges.push_back(torch::autograd::impl::gradient_edge(roots[i]));
    } else if (i < released.size() && released[i].is_valid()) {
      edges.push_back(released[i]);
    } else {
      continue;  // nothing downstream depended on that output
    }
    values.push_back(grads[i]);
  }
  if (edges.empty()) return;
  torch::autograd::Engine::get_default_engine().execute(edges, values, /*keep_graph=*/false, /*create_graph=*/false,
                                                         /*accumulate_grad=*/true, {});
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

void Runtime::run_action(const Action& action, StepContext& ctx) {
  const int k = action.stage, mb = action.microbatch;
  switch (action.kind) {
    case ActionKind::kForward:
      forward(k, mb, ctx);
      break;
    case ActionKind::kBackward:
      backward(k, mb, ctx);
      break;
    case ActionKind::kBackwardInput:
      backward_input(k, mb, ctx);
      break;
    case ActionKind::kWeight:
      backward_weight(k, mb, ctx);
      break;
  }
}

void Runtime::forward(int k, int mb, StepContext& ctx) {
  const Schedule& schedule = ctx.schedule;
  const StepData& data = ctx.data;
  Stage& stage = *stages_[k];
  auto& st = ctx.stages[k];
  const bool training = ctx.training();
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
    if (build_graph) x = as_input_leaves(std::move(x));
  }

  StashEntry entry;
  if (training && schedule.weight_stashing) {
    entry.weights = st.versions.for_forward(mb, st.updates);
    stage.read_weights(*entry.weights);
  }
  Tensors y;
  {
    c10::AutoGradMode grad_mode(build_graph);
    const AutocastScope autocast(stage.device().type(), training_.autocast);
    // A split backward differentiates layer by layer: keep every layer's outputs.
    std::vector<Tensors>* layer_outputs = build_graph && schedule.splits_backward() ? &entry.layer_outputs : nullptr;
    y = run_layers(stage, training ? x : std::move(x), inputs_only ? &entry.random : nullptr, layer_outputs);
  }
  if (!last) {
    Tensors sent = detached(y);
    st.activation_bytes += tensor_bytes(sent);
    waited(st.wait_out, st.blocked, [&] {
      transport_->send(Channel::kActivation, k, k + 1, mb, sent);
      return 0;
    });
    if (build_graph && running_.free_sent_activations && !schedule.splits_backward() &&
        transport_->copies(k, k + 1)) {
      release_sent(y, entry.released_roots);
    }
  }
  if (!training) {
    if (last && ctx.outputs) (*ctx.outputs)[mb] = std::move(y);
    return;
  }

  Tensors roots;
  if (last) {
    c10::AutoGradMode grad_mode(build_graph);
    at::Tensor loss;
    {
      const AutocastScope autocast(stage.device().type(), training_.autocast);
      loss = loss_of(mb, y, data);
    }
    if (FaultInjector* faults = fault_injector()) loss = faults->on_loss(k, mb, loss);
    if (guard_) {
      check_finite(k, mb, "loss", {loss.detach()}, ctx, Action{k, ActionKind::kForward, mb}.str());
    }
    if (st.microbatch_losses.size() <= static_cast<size_t>(mb)) st.microbatch_losses.resize(mb + 1);
    st.microbatch_losses[mb] = loss.detach();
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
  if (k > 0) entry.inputs = as_input_leaves(std::move(entry.inputs));
  std::vector<Tensors>* outputs = keep_layer_outputs ? &entry.layer_outputs : nullptr;
  const AutocastScope autocast(stage.device().type(), training_.autocast);
  Tensors y;
  stage.without_buffer_changes([&] {
    if (entry.random) {  // set only with the stage's own streams
      stage.random()->replay(*entry.random, [&] { y = stage.forward(entry.inputs, outputs); });
    } else {
      y = stage.forward(entry.inputs, outputs);
    }
  });
  if (k + 1 == num_stages()) return {loss_of(mb, y, data) * data.loss_scale[mb]};
  return requiring_grad(y);
}

void Runtime::backward(int k, int mb, StepContext& ctx) {
  Stage& stage = *stages_[k];
  auto& st = ctx.stages[k];
  StashEntry entry = st.stash.take(mb);
  if (entry.weights) {
    stage.read_weights(*entry.weights);
  } else {
    stage.read_live_weights();
  }
  const Tensors roots = entry.inputs_only ? replay_forward(k, mb, entry, ctx.data, false) : std::move(entry.roots);
  if (k + 1 == num_stages()) {
    torch::autograd::backward(roots);
  } else {
    // An undefined gradient means nothing downstream depended on that output.
    backward_through_graph(roots, entry.released_roots, receive_gradients(k, mb, roots, ctx));
  }
  if (k > 0) {
    Tensors input_grads(entry.inputs.size());
    for (size_t i = 0; i < entry.inputs.size(); ++i) {
      const at::Tensor& input = entry.inputs[i];
      if (input.defined() && input.requires_grad()) input_grads[i] = input.grad();
    }
    send_input_gradients(k, mb, input_grads, ctx);
  }
  if (ctx.schedule.step_per_microbatch) optimizer_step(k, mb, ctx);
}

Tensors Runtime::receive_gradients(int k, int mb, const Tensors& roots, StepContext& ctx) {
  const Tensors grads =
      waited(ctx.stages[k].wait_in, ctx.stages[k].blocked,
             [&] { return transport_->recv(Channel::kGradient, k + 1, k, mb); });
  TORCH_CHECK(grads.size() == roots.size(), "stage ", k + 1, " sent ", grads.size(), " gradient",
              grads.size() == 1 ? "" : "s", " for the ", roots.size(), " tensor", roots.size() == 1 ? "" : "s",
              " stage ", k, " passed it");
  return grads;
}

void Runtime::send_input_gradients(int k, int mb, const Tensors& grads, StepContext& ctx) {
  ctx.stages[k].gradient_bytes += tensor_bytes(grads);
  waited(ctx.stages[k].wait_out, ctx.stages[k].blocked, [&] {
    transport_->send(Channel::kGradient, k, k - 1, mb, grads);
    return 0;
  });
}

}  // namespace conveyor
