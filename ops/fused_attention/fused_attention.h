#pragma once
// Fused scaled-dot-product attention, out = softmax(q k^T * scale + masks) v,
// computed without ever writing the q_len x k_len score matrix to memory on
// CUDA (flash-attention style tiling with an online softmax), and by a plain
// ATen reference with the same semantics on CPU.
//
// Semantics shared by every backend (see README.md in this folder):
//   q [B, H, S_q, D], k [B, H, S_k, D], v [B, H, S_k, D]; one floating dtype
//   (float32, float64, float16, bfloat16); half types accumulate in float32.
//   key_padding_mask: optional bool [B, S_k], true = that key is ignored.
//   causal: query i sees keys j <= i, aligned to the top-left corner when
//     S_q != S_k, exactly as at::scaled_dot_product_attention(is_causal=true).
//   scale: defaults to 1/sqrt(D).
//   A query row whose keys are all masked has output 0, log-sum-exp 0 and
//   zero gradients (never NaN), on every backend.
//   lse: [B, H, S_q], natural log of sum_j exp(scale * q_i . k_j) over the
//     visible keys; float32, or float64 for float64 inputs.
//
// The functions below go through the dispatcher, so they reach the CPU or
// CUDA kernel for the tensors' device and record autograd where it applies.
// From Python: torch.ops.conveyor.fused_attention(q, k, v, mask, causal, scale).

#include "ops/dispatch/fused_dispatch.h"

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace conveyor {

// Differentiable attention (q, k and v get gradients).
at::Tensor fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::optional<at::Tensor>& key_padding_mask = std::nullopt, bool causal = false,
                           std::optional<double> scale = std::nullopt);

// The forward kernel alone: (out, lse). Not differentiable by itself.
std::tuple<at::Tensor, at::Tensor> fused_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                           const at::Tensor& v,
                                                           const std::optional<at::Tensor>& key_padding_mask,
                                                           bool causal, std::optional<double> scale);

// The backward kernel: (grad_q, grad_k, grad_v) from the forward's out and lse.
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const std::optional<at::Tensor>& key_padding_mask, bool causal, std::optional<double> scale);

// What FusedMultiheadAttention runs: fused_attention, or
// at::scaled_dot_product_attention (PyTorch's own backend choice) where the
// dispatch table finds it faster for this device, dtype, shape and whether
// there is a key-padding mask (ops/dispatch/fused_dispatch.h). A masked call
// on the reference path runs masked_reference_attention.
at::Tensor dispatched_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const std::optional<at::Tensor>& key_padding_mask = std::nullopt, bool causal = false,
                                std::optional<double> scale = std::nullopt);

// at::scaled_dot_product_attention given a key-padding mask, with
// fused_attention's meaning for a query row whose keys are all hidden
// (padded, or padded and causal): output 0 and zero gradients, where SDPA
// alone gives NaN. Such rows attend to every key inside SDPA (so nothing is
// 0/0), then their output is zeroed, which also zeros their gradients.
at::Tensor masked_reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& key_padding_mask, bool causal,
                                      std::optional<double> scale = std::nullopt);

// The dispatch table's key of an attention call (ops/dispatch/fused_dispatch.h).
DispatchQuery attention_query(const at::Tensor& q, const at::Tensor& k, bool masked, bool causal, bool train);

// The choice dispatched_attention() makes for these arguments, with its reason.
DispatchChoice attention_path(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const std::optional<at::Tensor>& key_padding_mask, bool causal);

}  // namespace conveyor
