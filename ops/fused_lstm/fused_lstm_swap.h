#pragma once
// torch::nn::LSTM -> conveyor::FusedLSTM for swap_fused_ops (registered in its
// table when the library loads).

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>

#include <memory>
#include <optional>
#include <string>

namespace conveyor {

// A FusedLSTM sharing the parameter tensors of `m`, a torch::nn::LSTM; or
// nullopt, with the reason in *why_not (when given), if `m` is not an LSTM or
// uses options FusedLSTM does not support (bidirectional, proj_size > 0).
std::optional<torch::nn::AnyModule> make_fused_lstm_from(const std::shared_ptr<torch::nn::Module>& m,
                                                         std::string* why_not = nullptr);

}  // namespace conveyor
