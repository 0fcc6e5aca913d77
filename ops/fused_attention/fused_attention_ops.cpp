// Schemas of the fused attention ops and typed calls through the dispatcher.

#include "ops/fused_attention/fused_attention.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace conveyor {

at::Tensor fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::optional<at::Tensor>& key_padding_mask, bool causal,
                           std::optional<double> scale) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("conveyor::fused_attention", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                               const std::optional<at::Tensor>&, bool, std::optional<double>)>();
  return op.call(q, k, v, key_padding_mask, causal, scale);
}

std::tuple<at::Tensor, at::Tensor> fused_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                           const at::Tensor& v,
                                                           const std::optional<at::Tensor>& key_padding_mask,
                                                           bool causal, std::optional<double> scale) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("conveyor::fused_attention_forward", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                    const std::optional<at::Tensor>&, bool, std::optional<double>)>();
  return op.call(q, k, v, key_padding_mask, causal, scale);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const std::optional<at::Tensor>& key_padding_mask, bool causal,
    std::optional<double> scale) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("conveyor::fused_attention_backward", "")
          .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const at::Tensor&, const std::optional<at::Tensor>&, bool, std::optional<double>)>();
  return op.call(grad_out, q, k, v, out, lse, key_padding_mask, causal, scale);
}

TORCH_LIBRARY_FRAGMENT(conveyor, m) {
  // out = softmax(q k^T * scale, hidden keys at -inf) v; q, k, v [B, H, S, D];
  // key_padding_mask bool [B, S_k], true = ignore; causal is top-left aligned;
  // scale defaults to 1/sqrt(D). Differentiable in q, k and v.
  m.def(
      "fused_attention(Tensor q, Tensor k, Tensor v, Tensor? key_padding_mask=None, bool causal=False, "
      "float? scale=None) -> Tensor");
  // (out, lse [B, H, S_q]), the kernel the autograd function saves from.
  m.def(
      "fused_attention_forward(Tensor q, Tensor k, Tensor v, Tensor? key_padding_mask=None, bool causal=False, "
      "float? scale=None) -> (Tensor, Tensor)");
  // (grad_q, grad_k, grad_v); recomputes the probabilities from lse.
  m.def(
      "fused_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
      "Tensor? key_padding_mask=None, bool causal=False, float? scale=None) -> (Tensor, Tensor, Tensor)");
}

}  // namespace conveyor
