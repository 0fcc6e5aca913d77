// Split backwards and offloaded stashes: what zero-bubble schedules (I and W
// actions) and offloading (schedules::Stash::kOffload) add to the runtime's
// actions (runtime_actions.cpp).
//
// A split backward is exact: I differentiates the stage's graph once with
// respect to its inputs and to every layer's outputs (retaining the graph),
// W then differentiates each layer from its outputs' gradients to its own
// parameters only, so every node runs once, as in one whole backward. A stage
// whose layers share a parameter cannot be cut at layer boundaries (a layer's
// W would reach the other layer): there I computes the input gradients only
// and W differentiates the whole stage for its weights, which repeats the
// activation gradients (slower, equally exact).
#include "plugin/errors.h"
#include "plugin/runtime.h"
#include "plugin/step_context.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

namespace conveyor {

using schedules::Schedule;

namespace {

bool differentiable(const at::Tensor& t) { return t.defined() && t.requires_grad(); }

}  // namespace

void Runtime::backward_input(int k, int mb, const Schedule& /*schedule*/, const StepData& data, StepContext& ctx) {
  Stage& stage = *stages_[k];
  StashEntry& entry = ctx.stages[k].stash.at(mb);
  TORCH_CHECK(!entry.input_backward_done, "the input backward of micro-batch ", mb, " already ran");
  stage.read_live_weights();
  const bool by_layer = !stage.shares_parameters_across_layers();
  const bool last = k + 1 == num_stages();
  Tensors roots = entry.inputs_only ? replay_forward(k, mb, entry, data, by_layer) : std::move(entry.roots);
  entry.roots.clear();
  // What the backward starts from: the loss, or the outputs stage k+1 sent gradients for.
  Tensors outputs, output_grads, received;  // received: slot by slot, as the roots
  if (last) {
    outputs = roots;
  } else {
    received = receive_gradients(k, mb, roots, ctx);
    for (size_t i = 0; i < roots.size(); ++i) {
      if (!roots[i].defined() || !received[i].defined()) continue;
      outputs.push_back(roots[i]);
      output_grads.push_back(received[i]);
    }
  }
  // What to capture: the stage's inputs (for stage k-1) and, layer by layer,
  // the outputs whose gradients the W needs. On a stage before the last, the
  // last layer's outputs are the roots: their gradients are the received ones.
  std::vector<at::Tensor> wanted;
  std::vector<std::pair<size_t, size_t>> slot_of;  // wanted[i] -> (layer, slot); layer == size: an input
  const size_t layers = entry.layer_outputs.size();
  if (k > 0) {
    for (size_t j = 0; j < entry.inputs.size(); ++j) {
      if (differentiable(entry.inputs[j])) {
        wanted.push_back(entry.inputs[j]);
        slot_of.emplace_back(layers, j);
      }
    }
  }
  if (by_layer) {
    entry.layer_grads.assign(layers, Tensors());
    for (size_t l = 0; l < layers; ++l) {
      const Tensors& outs = entry.layer_outputs[l];
      entry.layer_grads[l].assign(outs.size(), at::Tensor());
      if (!last && l + 1 == layers) continue;
      for (size_t j = 0; j < outs.size(); ++j) {
        if (differentiable(outs[j])) {
          wanted.push_back(outs[j]);
          slot_of.emplace_back(l, j);
        }
      }
    }
    if (!last && layers > 0) {
      for (size_t i = 0; i < received.size(); ++i) {
        if (roots[i].defined()) entry.layer_grads[layers - 1][i] = received[i];
      }
    }
  } else {
    // One group: the whole stage, from its roots, for the W.
    entry.layer_outputs = {outputs};
    entry.layer_grads = {output_grads};
  }
  Tensors input_grads(entry.inputs.size());
  if (!wanted.empty() && !outputs.empty()) {
    const auto grads = torch::autograd::grad(outputs, wanted, output_grads, /*retain_graph=*/true,
                                             /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t i = 0; i < wanted.size(); ++i) {
      const auto [l, j] = slot_of[i];
      (l == layers ? input_grads[j] : entry.layer_grads[l][j]) = grads[i];
    }
  }
  entry.input_backward_done = true;
  if (k > 0) send_input_gradients(k, mb, input_grads, ctx);
}

void Runtime::backward_weight(int k, int mb, StepContext& ctx) {
  Stage& stage = *stages_[k];
  StashEntry entry = ctx.stages[k].stash.take(mb);
  TORCH_CHECK(entry.input_backward_done, "the weight backward of micro-batch ", mb, " ran before its input backward");
  const bool by_layer = !stage.shares_parameters_across_layers();
  std::vector<at::Tensor> all;  // the whole stage's trainable weights (one group)
  if (!by_layer) {
    for (const auto& w : stage.live()) {
      if (w.requires_grad()) all.push_back(w);
    }
  }
  for (size_t l = 0; l < entry.layer_outputs.size(); ++l) {
    const std::vector<at::Tensor>& params = by_layer ? stage.layer_parameters(l) : all;
    if (params.empty()) continue;
    Tensors outs, grads;
    for (size_t j = 0; j < entry.layer_outputs[l].size(); ++j) {
      const at::Tensor& out = entry.layer_outputs[l][j];
      const at::Tensor& grad = j < entry.layer_grads[l].size() ? entry.layer_grads[l][j] : at::Tensor();
      if (!differentiable(out) || !grad.defined()) continue;
      outs.push_back(out);
      grads.push_back(grad);
    }
    if (outs.empty()) continue;
    torch::autograd::backward(outs, grads, /*retain_graph=*/false, /*create_graph=*/false, params);
  }
}

// --- offloading ------------------------------------------------------------

void Runtime::offload(int k, StashEntry& entry) {
  const std::optional<c10::Stream>& side = side_streams_[k];
  if (!side) return;  // on the CPU the stash already lives in host memory
  const c10::Stream compute = *streams_[k];
  c10::Event computed(compute.device_type());
  computed.record(compute);
  computed.block(*side);  // the copy reads what the forward wrote
  c10::StreamGuard on_side(*side);
  for (auto& t : entry.inputs) {
    if (!t.defined() || t.is_cpu()) continue;
    at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
    host.copy_(t, /*non_blocking=*/true);
    t.record_stream(*side);  // its memory is reused only once the copy is done
    t = host;
  }
  entry.offloaded = true;
}

void Runtime::prefetch(int k, StashEntry& entry) {
  if (!entry.offloaded || entry.prefetched_ready) return;
  const c10::Stream side = *side_streams_[k];
  const c10::Stream compute = *streams_[k];
  const c10::Device device = stages_[k]->device();
  c10::StreamGuard on_side(side);
  entry.prefetched.assign(entry.inputs.size(), at::Tensor());
  for (size_t i = 0; i < entry.inputs.size(); ++i) {
    const at::Tensor& host = entry.inputs[i];
    if (!host.defined() || !host.is_pinned()) {
      entry.prefetched[i] = host;
      continue;
    }
    at::Tensor back = at::empty(host.sizes(), host.options().device(device).pinned_memory(false));
    back.copy_(host, /*non_blocking=*/true);
    back.record_stream(compute);  // allocated on the side stream, used on the compute stream
    entry.prefetched[i] = back;
  }
  entry.prefetched_ready.emplace(side.device_type());
  entry.prefetched_ready->record(side);
}

void Runtime::bring_back(int k, StashEntry& entry) {
  if (!entry.offloaded) return;
  prefetch(k, entry);  // a no-op when the action before has done it
  entry.prefetched_ready->block(*streams_[k]);
  entry.inputs = std::move(entry.prefetched);
  entry.prefetched.clear();
  entry.prefetched_ready.reset();
  entry.offloaded = false;
}

}  // namespace conveyor
