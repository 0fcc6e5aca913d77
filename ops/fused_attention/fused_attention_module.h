#pragma once
// conveyor::FusedMultiheadAttention: torch::nn::MultiheadAttention with the
// attention itself computed by conveyor::fused_attention. Same options, same
// parameter names and shapes (in_proj_weight [3E, E], in_proj_bias,
// out_proj.{weight,bias}; q/k/v_proj_weight when kdim or vdim differ from E;
// bias_k, bias_v with add_bias_kv), same forward signature and sequence-first
// layout [L, N, E], so a state dict moves between the two unchanged.
//
// The fused path never forms the attention weights, so forward falls back to
// the math path of torch::nn::MultiheadAttention (same results, weights
// included) when
//   - need_weights is true (the default, as in torch: pass false to be fast),
//   - attn_mask is given and is not a top-left causal mask [L, S] (bool with
//     true above the diagonal, or float with -inf above it and 0 elsewhere),
//   - training with dropout > 0,
//   - `causal` is combined with add_bias_kv or add_zero_attn.
// A recognised causal attn_mask runs fused with causal=true; checking the mask
// costs one comparison (a device sync on CUDA), so prefer setting `causal`.
// A bool attn_mask means true = not allowed, as in Python's MultiheadAttention.

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/options/activation.h>
#include <torch/nn/pimpl.h>

#include <tuple>

namespace conveyor {

class FusedMultiheadAttentionImpl : public torch::nn::Cloneable<FusedMultiheadAttentionImpl> {
 public:
  FusedMultiheadAttentionImpl(int64_t embed_dim, int64_t num_heads)
      : FusedMultiheadAttentionImpl(torch::nn::MultiheadAttentionOptions(embed_dim, num_heads)) {}
  // causal: every query attends only to keys at or before its own position
  // (top-left aligned), without an attn_mask.
  explicit FusedMultiheadAttentionImpl(const torch::nn::MultiheadAttentionOptions& options, bool causal = false);

  // Returns (output [L, N, E], attention weights or an undefined tensor),
  // exactly as torch::nn::MultiheadAttention::forward.
  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                             const at::Tensor& key_padding_mask = {}, bool need_weights = true,
                                             const at::Tensor& attn_mask = {}, bool average_attn_weights = true);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  // Makes this module use `mha`'s parameter tensors and its out_proj module
  // (the same objects, not copies), so values are unchanged and an optimizer
  // built on `mha` keeps updating the weights this module computes with.
  // The options must match.
  void use_parameters_of(const torch::nn::MultiheadAttentionImpl& mha);

  torch::nn::MultiheadAttentionOptions options;
  bool causal = false;

  bool _qkv_same_embed_dim = true;
  int64_t head_dim = 0;
  at::Tensor in_proj_weight;
  at::Tensor in_proj_bias;
  at::Tensor bias_k;
  at::Tensor bias_v;
  torch::nn::Linear out_proj = nullptr;
  at::Tensor q_proj_weight;
  at::Tensor k_proj_weight;
  at::Tensor v_proj_weight;

 protected:
  FORWARD_HAS_DEFAULT_ARGS({3, torch::nn::AnyValue(at::Tensor())}, {4, torch::nn::AnyValue(true)},
                           {5, torch::nn::AnyValue(at::Tensor())}, {6, torch::nn::AnyValue(true)})

 private:
  std::tuple<at::Tensor, at::Tensor> math_forward(const at::Tensor& query, const at::Tensor& key,
                                                  const at::Tensor& value, const at::Tensor& key_padding_mask,
                                                  bool need_weights, const at::Tensor& attn_mask,
                                                  bool average_attn_weights);
  at::Tensor fused_forward(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                           const at::Tensor& key_padding_mask, bool causal_now);
};

TORCH_MODULE(FusedMultiheadAttention);

}  // namespace conveyor
