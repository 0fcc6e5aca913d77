// dispatched_attention(): the one place where FusedMultiheadAttention (and so EncoderLayer
// and swapped models) picks the fused kernel or PyTorch's
// scaled_dot_product_attention, per ops/dispatch/fused_dispatch.h, masked
// calls included (masked_reference_attention: SDPA safe on fully masked rows).
#include "ops/dispatch/fused_dispatch.h"
#include "ops/fused_attention/fused_attention.h"
#include "ops/fused_attention/fused_attention_checks.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace conveyor {

DispatchQuery attention_query(const at::Tensor& q, const at::Tensor& k, bool masked, bool causal, bool train) {
  DispatchQuery query{"attention", q.device(), q.scalar_type(), {}, {"causal", "mask", "train"}};
  query.shape = {{"batch_heads", static_cast<double>(q.size(0) * q.size(1))},
                 {"seq_q", static_cast<double>(q.size(2))},
                 {"seq_k", static_cast<double>(k.size(2))},
                 {"head_dim", static_cast<double>(q.size(3))},
                 {"causal", causal ? 1.0 : 0.0},
                 {"mask", masked ? 1.0 : 0.0},
                 {"train", train ? 1.0 : 0.0}};
  return query;
}

DispatchChoice attention_path(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const std::optional<at::Tensor>& key_padding_mask, bool causal) {
  static const bool cuda_kernel = has_cuda_kernel("conveyor::fused_attention_forward");
  const bool can_fuse = fused_kernel_can_run(cuda_kernel, q.device(), q.scalar_type());
  const bool masked = key_padding_mask.has_value() && key_padding_mask->defined();
  const bool train = at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  const DispatchQuery query = attention_query(q, k, masked, causal, train);
  if (masked && can_fuse && dispatch_policy() == DispatchPolicy::kTable &&
      !dispatch_table()->nearest(query, dispatch_device_name(q.device()))) {
    // Unmeasured masked calls keep the fused kernel, as before masks were
    // measured: the reference would materialise the mask ([B, 1, S_q, S_k]
    // with causal masking) and lose SDPA's flash backend.
    return {FusedPath::kFused, "no measured row for masked calls here: the fused kernel"};
  }
  return choose_fused_path(query, can_fuse);
}

at::Tensor masked_reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& key_padding_mask, bool causal, std::optional<double> scale) {
  attention::check_forward_inputs(q, k, v, key_padding_mask);  // the fused op's checks and messages
  const int64_t batch = q.size(0), q_len = q.size(2), k_len = k.size(2);
  const at::Tensor shown = key_padding_mask.logical_not();  // [B, S_k]: true = a key the query may see
  if (!causal) {
    // A batch entry whose keys are all padded: its rows attend to every key, then read 0.
    const at::Tensor dead = shown.any(-1).logical_not().view({batch, 1, 1, 1});
    const at::Tensor allowed = shown.view({batch, 1, 1, k_len}).logical_or(dead);
    return at::scaled_dot_product_attention(q, k, v, allowed, 0.0, false, scale).masked_fill(dead, 0);
  }
  // Causal, aligned to the top-left corner (query i sees keys j <= i), as fused_attention and SDPA's is_causal.
  const at::Tensor below = at::ones({q_len, k_len}, shown.options()).tril();
  at::Tensor allowed = shown.view({batch, 1, 1, k_len}).logical_and(below);  // [B, 1, S_q, S_k]
  const at::Tensor dead = allowed.any(-1, /*keepdim=*/true).logical_not();   // [B, 1, S_q, 1]
  allowed = allowed.logical_or(dead);
  return at::scaled_dot_product_attention(q, k, v, allowed, 0.0, false, scale).masked_fill(dead, 0);
}

at::Tensor dispatched_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const std::optional<at::Tensor>& key_padding_mask, bool causal,
                                std::optional<double> scale) {
  if (attention_path(q, k, v, key_padding_mask, causal).path == FusedPath::kFused) {
    return fused_attention(q, k, v, key_padding_mask, causal, scale);
  }
  if (key_padding_mask.has_value() && key_padding_mask->defined()) {
    return masked_reference_attention(q, k, v, *key_padding_mask, causal, scale);
  }
  return at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, causal, scale);
}

}  // namespace conveyor
