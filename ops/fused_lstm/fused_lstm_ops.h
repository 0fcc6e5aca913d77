#pragma once
// The three dispatcher ops behind conveyor::fused_lstm, their kernel
// signatures, and typed calls through the dispatcher.
//
//   fused_lstm(input, h0, c0, weights, has_biases) -> (output, h_n, c_n)
//       the public op; its Autograd kernel (fused_lstm_autograd.cpp) calls
//   fused_lstm_with_workspace(...) -> (output, h_n, c_n, gates, cells, hiddens)
//       the forward that also returns what the backward needs, and
//   fused_lstm_backward(grad_output?, grad_h_n?, grad_c_n?, input, h0, c0,
//                       weights, has_biases, output, gates, cells, hiddens)
//       -> (grad_input, grad_h0, grad_c0, grad_weights[])

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <optional>
#include <tuple>
#include <vector>

namespace conveyor::lstm {

using LstmOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using LstmOutputsWithWorkspace = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using LstmGradients = std::tuple<at::Tensor, at::Tensor, at::Tensor, std::vector<at::Tensor>>;

using ForwardFn = LstmOutputs(const at::Tensor& input, const at::Tensor& h0, const at::Tensor& c0,
                              at::TensorList weights, bool has_biases);
using ForwardWithWorkspaceFn = LstmOutputsWithWorkspace(const at::Tensor& input, const at::Tensor& h0,
                                                        const at::Tensor& c0, at::TensorList weights, bool has_biases);
using BackwardFn = LstmGradients(const std::optional<at::Tensor>& grad_output,
                                 const std::optional<at::Tensor>& grad_h_n, const std::optional<at::Tensor>& grad_c_n,
                                 const at::Tensor& input, const at::Tensor& h0, const at::Tensor& c0,
                                 at::TensorList weights, bool has_biases, const at::Tensor& output,
                                 const at::Tensor& gates, const at::Tensor& cells, const at::Tensor& hiddens);

// Through the dispatcher, below autograd for the last two.
LstmOutputs call_fused_lstm(const at::Tensor& input, const at::Tensor& h0, const at::Tensor& c0, at::TensorList weights,
                            bool has_biases);
LstmOutputsWithWorkspace call_fused_lstm_with_workspace(const at::Tensor& input, const at::Tensor& h0,
                                                        const at::Tensor& c0, at::TensorList weights, bool has_biases);
LstmGradients call_fused_lstm_backward(const std::optional<at::Tensor>& grad_output,
                                       const std::optional<at::Tensor>& grad_h_n,
                                       const std::optional<at::Tensor>& grad_c_n, const at::Tensor& input,
                                       const at::Tensor& h0, const at::Tensor& c0, at::TensorList weights,
                                       bool has_biases, const at::Tensor& output, const at::Tensor& gates,
                                       const at::Tensor& cells, const at::Tensor& hiddens);

}  // namespace conveyor::lstm
