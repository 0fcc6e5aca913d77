// The autograd function registered for the Autograd key: its forward runs
// fused_attention_forward below autograd and saves (q, k, v, out, lse); its
// backward calls fused_attention_backward. Double backward is not supported
// (the backward kernels are not themselves differentiable).

#include "ops/fused_attention/fused_attention.h"

#include <torch/autograd.h>
#include <torch/library.h>

namespace conveyor {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class FusedAttentionFunction : public torch::autograd::Function<FusedAttentionFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::optional<at::Tensor>& key_padding_mask, bool causal,
                            std::optional<double> scale) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, lse] = fused_attention_forward(q, k, v, key_padding_mask, causal, scale);
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["key_padding_mask"] = key_padding_mask.has_value() ? c10::IValue(*key_padding_mask) : c10::IValue();
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale.has_value() ? c10::IValue(*scale) : c10::IValue();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const c10::IValue& mask = ctx->saved_data["key_padding_mask"];
    const c10::IValue& scale = ctx->saved_data["scale"];
    at::Tensor grad_out = grad_outputs[0];
    if (!grad_out.defined()) grad_out = at::zeros_like(saved[3]);
    auto [grad_q, grad_k, grad_v] = fused_attention_backward(
        grad_out, saved[0], saved[1], saved[2], saved[3], saved[4],
        mask.isNone() ? std::nullopt : std::optional<at::Tensor>(mask.toTensor()), ctx->saved_data["causal"].toBool(),
        scale.isNone() ? std::nullopt : std::optional<double>(scale.toDouble()));
    // One entry per forward argument: q, k, v, mask, causal, scale.
    return {grad_q, grad_k, grad_v, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor fused_attention_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const std::optional<at::Tensor>& key_padding_mask, bool causal,
                                    std::optional<double> scale) {
  return FusedAttentionFunction::apply(q, k, v, key_padding_mask, causal, scale);
}

}  // namespace

TORCH_LIBRARY_IMPL(conveyor, Autograd, m) { m.impl("fused_attention", &fused_attention_autograd); }

}  // namespace conveyor
