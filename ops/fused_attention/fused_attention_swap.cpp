#include "ops/fused_attention/fused_attention_swap.h"

#include "ops/fused_attention/fused_attention_module.h"
#include "ops/swap.h"

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

namespace {

bool is_multihead_attention(const torch::nn::Module& module) {
  return dynamic_cast<const torch::nn::MultiheadAttentionImpl*>(&module) != nullptr;
}

// Enters MultiheadAttention -> FusedMultiheadAttention in the table that
// swap_fused_ops consults (ops/swap.h), when the library loads.
const RegisterFusedSwapper kAttentionSwapper{
    FusedSwapper{"MultiheadAttention -> FusedMultiheadAttention", is_multihead_attention, make_fused_attention_from}};

}  // namespace

}  // namespace conveyor
