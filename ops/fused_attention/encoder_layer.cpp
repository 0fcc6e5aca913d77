#include "ops/fused_attention/encoder_layer.h"

#include "ops/fused_attention/fused_attention_module.h"

#include <ATen/autocast_mode.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/modules/activation.h>

#include <tuple>

namespace conveyor {

EncoderLayerImpl::EncoderLayerImpl(torch::nn::TransformerEncoderLayerOptions options_) : options(std::move(options_)) {
  build(/*clone_attention=*/false);
}

EncoderLayerImpl::EncoderLayerImpl(torch::nn::TransformerEncoderLayerOptions options_, torch::nn::AnyModule self_attn_)
    : options(std::move(options_)), self_attn(std::move(self_attn_)) {
  TORCH_CHECK(!self_attn.is_empty(), "EncoderLayer: the self_attn module is empty");
  build(/*clone_attention=*/false);
}

void EncoderLayerImpl::reset() { build(/*clone_attention=*/true); }

void EncoderLayerImpl::build(bool clone_attention) {
  if (self_attn.is_empty()) {
    self_attn = torch::nn::AnyModule(torch::nn::MultiheadAttention(
        torch::nn::MultiheadAttentionOptions(options.d_model(), options.nhead()).dropout(options.dropout())));
  } else if (clone_attention) {
    self_attn = self_attn.clone();
  }
  // Registration order matches torch::nn::TransformerEncoderLayer.
  register_module("self_attn", self_attn.ptr());
  linear1 = register_module("linear1", torch::nn::Linear(options.d_model(), options.dim_feedforward()));
  dropout = register_module("dropout", torch::nn::Dropout(options.dropout()));
  linear2 = register_module("linear2", torch::nn::Linear(options.dim_feedforward(), options.d_model()));
  norm1 = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({options.d_model()})));
  norm2 = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({options.d_model()})));
  dropout1 = register_module("dropout1", torch::nn::Dropout(options.dropout()));
  dropout2 = register_module("dropout2", torch::nn::Dropout(options.dropout()));
}

void EncoderLayerImpl::set_self_attn(torch::nn::AnyModule attention) {
  TORCH_CHECK(!attention.is_empty(), "EncoderLayer::set_self_attn: the module is empty");
  self_attn = std::move(attention);
  replace_module("self_attn", self_attn.ptr());
}

std::shared_ptr<torch::nn::Module> EncoderLayerImpl::inner() const { return named_children()["self_attn"]; }

void EncoderLayerImpl::sync_self_attn() {
  const std::shared_ptr<torch::nn::Module> child = named_children()["self_attn"];
  if (child == self_attn.ptr()) return;
  // Someone called replace_module("self_attn", m): wrap m so it can be called.
  if (auto fused = std::dynamic_pointer_cast<FusedMultiheadAttentionImpl>(child)) {
    self_attn = torch::nn::AnyModule(fused);
  } else if (auto mha = std::dynamic_pointer_cast<torch::nn::MultiheadAttentionImpl>(child)) {
    self_attn = torch::nn::AnyModule(mha);
  } else {
    TORCH_CHECK(false, "EncoderLayer: self_attn was replaced by a ", child->name(),
                ", which EncoderLayer cannot call through replace_module; use set_self_attn(AnyModule) instead");
  }
}

at::Tensor EncoderLayerImpl::activation(const at::Tensor& x) const {
  const auto& act = options.activation();
  if (std::holds_alternative<torch::enumtype::kReLU>(act)) return torch::nn::functional::relu(x);
  if (std::holds_alternative<torch::enumtype::kGELU>(act)) return torch::nn::functional::gelu(x);
  return std::get<std::function<at::Tensor(const at::Tensor&)>>(act)(x);
}

at::Tensor EncoderLayerImpl::forward(const at::Tensor& src, const at::Tensor& src_mask,
                                     const at::Tensor& src_key_padding_mask) {
  sync_self_attn();
  // LibTorch's C++ multi_head_attention_forward applies a mask through
  // AT_DISPATCH_FLOATING_TYPES (float and double only), so under autocast
  // (or on bf16/fp16 input) torch::nn::MultiheadAttention with a mask runs
  // in fp32, autocast off, as a softmax-heavy op would under CUDA autocast.
  const c10::DeviceType device = src.device().type();
  const bool reduced = src.scalar_type() == at::kBFloat16 || src.scalar_type() == at::kHalf;
  const bool masked = src_key_padding_mask.defined() || src_mask.defined();
  const bool fp32_attention = masked && (reduced || at::autocast::is_autocast_enabled(device)) &&
                              std::dynamic_pointer_cast<torch::nn::MultiheadAttentionImpl>(self_attn.ptr()) != nullptr;
  at::Tensor attended;
  // need_weights = false: the result is the same and the fused module can
  // skip forming the weights.
  if (fp32_attention) {
    const bool was_enabled = at::autocast::is_autocast_enabled(device);
    at::autocast::set_autocast_enabled(device, false);
    try {
      const at::Tensor x = src.to(at::kFloat);
      const at::Tensor mask = src_mask.defined() && src_mask.is_floating_point() ? src_mask.to(at::kFloat) : src_mask;
      attended = std::get<0>(self_attn.forward<std::tuple<at::Tensor, at::Tensor>>(
          x, x, x, src_key_padding_mask, /*need_weights=*/false, mask));
    } catch (...) {
      at::autocast::set_autocast_enabled(device, was_enabled);
      throw;
    }
    at::autocast::set_autocast_enabled(device, was_enabled);
  } else {
    attended = std::get<0>(self_attn.forward<std::tuple<at::Tensor, at::Tensor>>(
        src, src, src, src_key_padding_mask, /*need_weights=*/false, src_mask));
  }
  const at::Tensor x = norm1(src + dropout1(attended));
  return norm2(x + dropout2(linear2(dropout(activation(linear1(x))))));
}

void EncoderLayerImpl::pretty_print(std::ostream& stream) const {
  stream << "conveyor::EncoderLayer(d_model=" << options.d_model() << ", nhead=" << options.nhead()
         << ", dim_feedforward=" << options.dim_feedforward() << ")";
}

}  // namespace conveyor
