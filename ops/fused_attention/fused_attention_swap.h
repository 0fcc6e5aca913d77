#pragma once
// The hook conveyor::swap_fused_ops uses (registered in fused_attention_swap.cpp)
// to replace torch::nn::MultiheadAttention by conveyor::FusedMultiheadAttention
// computing with the same parameter tensors (shared, not copied: values,
// dtypes, devices and an optimizer built beforehand all carry over) and in the
// same training mode.
//
// A swapped module must be reachable through a parent that calls it via the
// registered child (conveyor::EncoderLayer does); the typed `self_attn` member
// of torch::nn::TransformerEncoderLayer cannot be replaced, and swap_fused_ops
// skips it with that reason.

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>

#include <memory>
#include <optional>
#include <string>

namespace conveyor {

// A FusedMultiheadAttention equivalent to `m` when `m` is a
// torch::nn::MultiheadAttention; otherwise std::nullopt, with the reason in
// *why_not when why_not is not null.
std::optional<torch::nn::AnyModule> make_fused_attention_from(const std::shared_ptr<torch::nn::Module>& m,
                                                              std::string* why_not = nullptr);

}  // namespace conveyor
