#include "ops/fused_attention/swap_attention.h"

#include "ops/fused_attention/fused_multihead_attention.h"

#include <torch/nn/modules/activation.h>

namespace conveyor {

std::optional<torch::nn::AnyModule> make_fused_attention_from(const std::shared_ptr<torch::nn::Module>& m,
                                                              std::string* why_not) {
  auto mha = std::dynamic_pointer_cast<torch::nn::MultiheadAttentionImpl>(m);
  if (!mha) {
    if (why_not) *why_not = m ? m->name() + " is not a torch::nn::MultiheadAttention" : "the module is null";
    return std::nullopt;
  }
  FusedMultiheadAttention fused(mha->options);
  fused->use_parameters_of(*mha);
  fused->train(mha->is_training());
  return torch::nn::AnyModule(fused);
}

}  // namespace conveyor
