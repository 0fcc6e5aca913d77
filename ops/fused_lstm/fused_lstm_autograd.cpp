// Autograd for conveyor::fused_lstm: a torch::autograd::Function whose forward
// runs fused_lstm_with_workspace and whose backward runs fused_lstm_backward,
// so both directions use the device's own kernels.
#include "ops/fused_lstm/fused_lstm_ops.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

namespace conveyor::lstm {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class FusedLstmFunction : public torch::autograd::Function<FusedLstmFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& h0,
                               const at::Tensor& c0, at::TensorList weights, bool has_biases) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [output, h_n, c_n, gates, cells, hiddens] = call_fused_lstm_with_workspace(input, h0, c0, weights, has_biases);
    std::vector<at::Tensor> saved{input, h0, c0, output, gates, cells, hiddens};
    saved.insert(saved.end(), weights.begin(), weights.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["has_biases"] = has_biases;
    // Unused outputs (often h_n and c_n) then get no gradient instead of zeros.
    ctx->set_materialize_grads(false);
    return {output, h_n, c_n};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const bool has_biases = ctx->saved_data["has_biases"].toBool();
    const std::vector<at::Tensor> weights(saved.begin() + 7, saved.end());
    auto [grad_input, grad_h0, grad_c0, grad_weights] =
        call_fused_lstm_backward(grads[0], grads[1], grads[2], saved[0], saved[1], saved[2], weights, has_biases,
                                 saved[3], saved[4], saved[5], saved[6]);
    // One gradient per forward argument; has_biases gets none.
    variable_list result{grad_input, grad_h0, grad_c0};
    result.insert(result.end(), grad_weights.begin(), grad_weights.end());
    result.emplace_back();
    return result;
  }
};

bool any_requires_grad(const at::Tensor& input, const at::Tensor& h0, const at::Tensor& c0, at::TensorList weights) {
  if (input.requires_grad() || h0.requires_grad() || c0.requires_grad()) return true;
  for (const auto& w : weights) {
    if (w.requires_grad()) return true;
  }
  return false;
}

LstmOutputs fused_lstm_autograd(const at::Tensor& input, const at::Tensor& h0, const at::Tensor& c0,
                                at::TensorList weights, bool has_biases) {
  if (!at::GradMode::is_enabled() || !any_requires_grad(input, h0, c0, weights)) {
    // No graph to record: skip the workspace the backward would need.
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_fused_lstm(input, h0, c0, weights, has_biases);
  }
  const variable_list out = FusedLstmFunction::apply(input, h0, c0, weights, has_biases);
  return {out[0], out[1], out[2]};
}

}  // namespace
}  // namespace conveyor::lstm

TORCH_LIBRARY_IMPL(conveyor, Autograd, m) { m.impl("fused_lstm", &conveyor::lstm::fused_lstm_autograd); }
