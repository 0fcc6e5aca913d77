// Split backwards: what zero-bubble schedules (I and W actions) add to the
// runtime's actions (actions.cpp).
//
// A split backward is exact: I differentiates the stage's graph once with
// respect to its inputs and to every layer's outputs (retaining the graph),
// W then differentiates each layer from its outputs' gradients to its own
// parameters only, so every node runs once, as in one whole backward. A stage
// whose layers share a parameter cannot be cut at layer boundaries (a layer's
// W would reach the other layer): there I computes the input gradients only
// and W differentiates the whole stage for its weights, which repeats the
// activation gradients (slower, equally exact).
#include "plugin/runtime/runtime.h"
#include "plugin/runtime/step_context.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

namespace conveyor {

namespace {

bool differentiable(const at::Tensor& t) { return t.defined() && t.requires_grad(); }

}  // namespace

void Runtime::backward_input(int k, int mb, StepContext& ctx) {
  Stage& stage = *stages_[k];
  StashEntry& entry = ctx.stages[k].stash.at(mb);
  TORCH_CHECK(!entry.input_backward_done, "the input backward of micro-batch ", mb, " already ran");
  stage.read_live_weights();
  const bool by_layer = !stage.shares_parameters_across_layers();
  const bool last = k + 1 == num_stages();
  Tensors roots = entry.inputs_only ? replay_forward(k, mb, entry, ctx.data, by_layer) : std::move(entry.roots);
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

}  // namespace conveyor
