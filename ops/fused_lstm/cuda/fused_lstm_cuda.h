#pragma once
// The CUDA kernels of the fused LSTM ops (signatures in fused_lstm_ops.h),
// registered for the CUDA dispatch key by fused_lstm_cuda_registration.cpp.

#include "ops/fused_lstm/fused_lstm_ops.h"

namespace conveyor::lstm {

LstmOutputs fused_lstm_cuda(const at::Tensor& input, const at::Tensor& h0, const at::Tensor& c0, at::TensorList weights,
                            bool has_biases);

LstmOutputsWithWorkspace fused_lstm_with_workspace_cuda(const at::Tensor& input, const at::Tensor& h0,
                                                        const at::Tensor& c0, at::TensorList weights, bool has_biases);

LstmGradients fused_lstm_backward_cuda(const std::optional<at::Tensor>& grad_output,
                                       const std::optional<at::Tensor>& grad_h_n,
                                       const std::optional<at::Tensor>& grad_c_n, const at::Tensor& input,
                                       const at::Tensor& h0, const at::Tensor& c0, at::TensorList weights,
                                       bool has_biases, const at::Tensor& output, const at::Tensor& gates,
                                       const at::Tensor& cells, const at::Tensor& hiddens);

}  // namespace conveyor::lstm
