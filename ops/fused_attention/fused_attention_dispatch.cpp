// dispatched_attention(): the one place where FusedMultiheadAttention (and so EncoderLayer
// and swapped models) picks the fused kernel or PyTorch's
// scaled_dot_product_attention, per ops/dispatch/fused_dispatch.h.
#include "ops/dispatch/fused_dispatch.h"
#include "ops/fused_attention/fused_attention.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace conveyor {

DispatchChoice attention_path(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const std::optional<at::Tensor>& key_padding_mask, bool causal) {
  static const bool cuda_kernel = has_cuda_kernel("conveyor::fused_attention_forward");
  const bool can_fuse = fused_kernel_can_run(cuda_kernel, q.device(), q.scalar_type());
  if (key_padding_mask.has_value() && key_padding_mask->defined()) {
    // SDPA gives NaN where a query's keys are all masked; the fused kernel gives 0.
    if (can_fuse) return {FusedPath::kFused, "a key-padding mask runs the fused kernel"};
  }
  const bool train = at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  DispatchQuery query{"attention", q.device(), q.scalar_type(), {}, {"causal", "train"}};
  query.shape = {{"batch_heads", static_cast<double>(q.size(0) * q.size(1))},
                 {"seq_q", static_cast<double>(q.size(2))},
                 {"seq_k", static_cast<double>(k.size(2))},
                 {"head_dim", static_cast<double>(q.size(3))},
                 {"causal", causal ? 1.0 : 0.0},
                 {"train", train ? 1.0 : 0.0}};
  return choose_fused_path(query, can_fuse);
}

at::Tensor dispatched_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const std::optional<at::Tensor>& key_padding_mask, bool causal,
                                std::optional<double> scale) {
  if (attention_path(q, k, v, key_padding_mask, causal).path == FusedPath::kFused) {
    return fused_attention(q, k, v, key_padding_mask, causal, scale);
  }
  std::optional<at::Tensor> mask;
  if (key_padding_mask.has_value() && key_padding_mask->defined()) {
    // Only reached where no fused kernel exists: true = ignored here, = allowed for SDPA.
    mask = key_padding_mask->logical_not().view({q.size(0), 1, 1, k.size(2)});
  }
  return at::scaled_dot_product_attention(q, k, v, mask, 0.0, causal, scale);
}

}  // namespace conveyor
