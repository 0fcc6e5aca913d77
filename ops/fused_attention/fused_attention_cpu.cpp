// The CPU reference: plain ATen arithmetic in float32 (float64 for float64
// inputs) that forms the whole score matrix. It defines the semantics the CUDA
// kernels must reproduce, fully masked query rows included (output 0, lse 0,
// zero gradients), and it is what the CPU tests and the CPU pipeline run.

#include "ops/fused_attention/fused_attention.h"
#include "ops/fused_attention/fused_attention_checks.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <limits>

namespace conveyor {
namespace {

using attention::AttentionShape;

// True where query i must not see key j, broadcastable to [B, H, S_q, S_k];
// undefined when nothing is masked.
at::Tensor hidden_keys(const AttentionShape& s, const at::Tensor& key_padding_mask, bool causal,
                       const at::TensorOptions& options) {
  at::Tensor hidden;
  if (causal) {
    // Top-left aligned: key j is hidden from query i when j > i. (Built by
    // comparison rather than triu(), which is slow on small inputs.)
    const at::Tensor queries = at::arange(s.q_len, options.dtype(at::kLong)).unsqueeze(1);
    hidden = at::arange(s.k_len, options.dtype(at::kLong)).unsqueeze(0) > queries;
  }
  if (key_padding_mask.defined()) {
    const at::Tensor padded = key_padding_mask.view({s.batch, 1, 1, s.k_len});
    hidden = hidden.defined() ? at::logical_or(hidden, padded) : padded;
  }
  return hidden;
}

// Scaled scores with hidden keys at -inf, in the accumulation dtype.
at::Tensor masked_scores(const at::Tensor& q, const at::Tensor& k, const AttentionShape& s,
                         const at::Tensor& key_padding_mask, bool causal, double scale) {
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)).mul_(scale);
  const at::Tensor hidden = hidden_keys(s, key_padding_mask, causal, scores.options());
  if (hidden.defined()) scores.masked_fill_(hidden, -std::numeric_limits<double>::infinity());
  return scores;
}

std::tuple<at::Tensor, at::Tensor> attention_forward_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                         const std::optional<at::Tensor>& key_padding_mask, bool causal,
                                                         std::optional<double> scale) {
  const AttentionShape s = attention::check_forward_inputs(q, k, v, key_padding_mask);
  const at::ScalarType acc = attention::accumulate_dtype(q.scalar_type());
  if (s.k_len == 0) {  // no keys at all: every row is fully masked
    return {at::zeros_like(q), at::zeros({s.batch, s.heads, s.q_len}, q.options().dtype(acc))};
  }
  const double softmax_scale = attention::resolve_scale(scale, s.head_dim);
  const at::Tensor qa = q.to(acc), ka = k.to(acc), va = v.to(acc);
  const at::Tensor scores =
      masked_scores(qa, ka, s, attention::mask_or_undefined(key_padding_mask), causal, softmax_scale);

  at::Tensor row_max = scores.amax(-1, /*keepdim=*/true);
  // A row whose keys are all hidden has max -inf; shifting it by 0 instead
  // keeps exp() at exactly 0 for every key, so its sum is 0, not NaN.
  const at::Tensor empty_row = at::isneginf(row_max);
  row_max.masked_fill_(empty_row, 0);
  const at::Tensor p = (scores - row_max).exp_();
  const at::Tensor row_sum = p.sum(-1, /*keepdim=*/true).masked_fill_(empty_row, 1);
  const at::Tensor out = at::matmul(p, va).div_(row_sum);
  const at::Tensor lse = (row_max + row_sum.log()).masked_fill_(empty_row, 0).squeeze(-1);
  return {out.to(q.scalar_type()), lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward_cpu(const at::Tensor& grad_out, const at::Tensor& q,
                                                                      const at::Tensor& k, const at::Tensor& v,
                                                                      const at::Tensor& out, const at::Tensor& lse,
                                                                      const std::optional<at::Tensor>& key_padding_mask,
                                                                      bool causal, std::optional<double> scale) {
  const AttentionShape s = attention::check_backward_inputs(grad_out, q, k, v, out, lse, key_padding_mask);
  if (s.k_len == 0) return {at::zeros_like(q), at::zeros_like(k), at::zeros_like(v)};
  const double softmax_scale = attention::resolve_scale(scale, s.head_dim);
  const at::ScalarType acc = attention::accumulate_dtype(q.scalar_type());
  const at::Tensor qa = q.to(acc), ka = k.to(acc), va = v.to(acc);
  const at::Tensor dout = grad_out.to(acc);

  // Probabilities recomputed from the saved log-sum-exp; hidden keys are -inf
  // so they, and every key of a fully masked row, get probability 0.
  const at::Tensor p =
      (masked_scores(qa, ka, s, attention::mask_or_undefined(key_padding_mask), causal, softmax_scale) -
       lse.unsqueeze(-1))
          .exp_();
  const at::Tensor grad_v = at::matmul(p.transpose(-2, -1), dout);
  const at::Tensor grad_p = at::matmul(dout, va.transpose(-2, -1));
  // softmax backward: dS = P * (dP - rowsum(dO * O)).
  const at::Tensor row_dot = (dout * out.to(acc)).sum(-1, /*keepdim=*/true);
  const at::Tensor grad_s = p.mul(grad_p.sub_(row_dot)).mul_(softmax_scale);
  const at::Tensor grad_q = at::matmul(grad_s, ka);
  const at::Tensor grad_k = at::matmul(grad_s.transpose(-2, -1), qa);
  return {grad_q.to(q.scalar_type()), grad_k.to(k.scalar_type()), grad_v.to(v.scalar_type())};
}

at::Tensor attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& key_padding_mask, bool causal, std::optional<double> scale) {
  return std::get<0>(attention_forward_cpu(q, k, v, key_padding_mask, causal, scale));
}

}  // namespace

TORCH_LIBRARY_IMPL(conveyor, CPU, m) {
  m.impl("fused_attention", &attention_cpu);
  m.impl("fused_attention_forward", &attention_forward_cpu);
  m.impl("fused_attention_backward", &attention_backward_cpu);
}

}  // namespace conveyor
