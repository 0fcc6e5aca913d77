// Enters MultiheadAttention -> FusedMultiheadAttention in the table that
// conveyor::swap_fused_ops consults (ops/swap.h), when the library loads.

#include "ops/fused_attention/swap_attention.h"
#include "ops/swap.h"

#include <torch/nn/modules/activation.h>

namespace conveyor {
namespace {

bool is_multihead_attention(const torch::nn::Module& module) {
  return dynamic_cast<const torch::nn::MultiheadAttentionImpl*>(&module) != nullptr;
}

const RegisterFusedSwapper kAttentionSwapper{
    FusedSwapper{"MultiheadAttention -> FusedMultiheadAttention", is_multihead_attention, make_fused_attention_from}};

}  // namespace
}  // namespace conveyor
