#pragma once
// conveyor::EncoderLayer: a BERT-style post-norm transformer encoder layer,
//   x = norm1(src + dropout1(self_attn(src, src, src)))
//   y = norm2(x + dropout2(linear2(dropout(activation(linear1(x))))))
// the math of torch::nn::TransformerEncoderLayer (norm_first = false) with the
// same options and parameter names (self_attn.*, linear1, linear2, norm1,
// norm2), so state dicts move between the two.
//
// It exists because torch::nn::TransformerEncoderLayer holds its attention as
// a typed MultiheadAttention whose forward is not virtual, so nothing can be
// swapped into it. Here the attention is a torch::nn::AnyModule: either a
// torch::nn::MultiheadAttention or a conveyor::FusedMultiheadAttention (or any
// module with MultiheadAttention's forward signature). It is a
// conveyor::WrapsInnerModule around that attention, so conveyor::swap_fused_ops
// replaces it in place; by hand, use set_self_attn(), or
// replace_module("self_attn", m) when m is one of the two known attention
// types (the layer picks the new child up on its next forward).

#include "ops/adapters.h"

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/options/transformerlayer.h>
#include <torch/nn/pimpl.h>

namespace conveyor {

class EncoderLayerImpl : public torch::nn::Cloneable<EncoderLayerImpl>, public WrapsInnerModule {
 public:
  EncoderLayerImpl(int64_t d_model, int64_t nhead)
      : EncoderLayerImpl(torch::nn::TransformerEncoderLayerOptions(d_model, nhead)) {}
  // Attention: a new torch::nn::MultiheadAttention(d_model, nhead, dropout).
  explicit EncoderLayerImpl(torch::nn::TransformerEncoderLayerOptions options);
  // Attention: the given module, used as is (not copied).
  EncoderLayerImpl(torch::nn::TransformerEncoderLayerOptions options, torch::nn::AnyModule self_attn);

  // src [S, N, d_model]; src_mask an attn_mask [S, S]; src_key_padding_mask
  // bool [N, S], true = ignore that position.
  at::Tensor forward(const at::Tensor& src, const at::Tensor& src_mask = {},
                     const at::Tensor& src_key_padding_mask = {});

  // A fresh layer with new weights; the attention module is cloned when one
  // was given (reset() is what Cloneable::clone calls on the copy).
  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  // Swaps the attention module, keeping the registered name "self_attn".
  void set_self_attn(torch::nn::AnyModule attention);

  // WrapsInnerModule: the attention module, which swap_fused_ops may replace.
  std::shared_ptr<torch::nn::Module> inner() const override;
  void replace_inner(torch::nn::AnyModule replacement) override { set_self_attn(std::move(replacement)); }

  torch::nn::TransformerEncoderLayerOptions options;
  torch::nn::AnyModule self_attn;
  torch::nn::Linear linear1 = nullptr;
  torch::nn::Dropout dropout = nullptr;
  torch::nn::Linear linear2 = nullptr;
  torch::nn::LayerNorm norm1 = nullptr;
  torch::nn::LayerNorm norm2 = nullptr;
  torch::nn::Dropout dropout1 = nullptr;
  torch::nn::Dropout dropout2 = nullptr;

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(at::Tensor())}, {2, torch::nn::AnyValue(at::Tensor())})

 private:
  void build(bool clone_attention);
  void sync_self_attn();
  at::Tensor activation(const at::Tensor& x) const;
};

TORCH_MODULE(EncoderLayer);

}  // namespace conveyor
