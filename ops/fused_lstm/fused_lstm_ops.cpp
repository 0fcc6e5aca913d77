// Schemas of the fused LSTM ops and typed calls through the dispatcher.
#include "ops/fused_lstm/fused_lstm_ops.h"

#include "ops/fused_lstm/fused_lstm.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(conveyor, m) {
  m.def(
      "fused_lstm(Tensor input, Tensor h0, Tensor c0, Tensor[] weights, bool has_biases)"
      " -> (Tensor output, Tensor h_n, Tensor c_n)");
  m.def(
      "fused_lstm_with_workspace(Tensor input, Tensor h0, Tensor c0, Tensor[] weights, bool has_biases)"
      " -> (Tensor output, Tensor h_n, Tensor c_n, Tensor gates, Tensor cells, Tensor hiddens)");
  m.def(
      "fused_lstm_backward(Tensor? grad_output, Tensor? grad_h_n, Tensor? grad_c_n, Tensor input,"
      " Tensor h0, Tensor c0, Tensor[] weights, bool has_biases, Tensor output, Tensor gates,"
      " Tensor cells, Tensor hiddens) -> (Tensor grad_input, Tensor grad_h0, Tensor grad_c0,"
      " Tensor[] grad_weights)");
}

namespace conveyor {

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm(const at::Tensor& input, const at::Tensor& h0,
                                                          const at::Tensor& c0, at::TensorList weights,
                                                          bool has_biases) {
  return lstm::call_fused_lstm(input, h0, c0, weights, has_biases);
}

namespace lstm {

LstmOutputs call_fused_lstm(const at::Tensor& input, const at::Tensor& h0, const at::Tensor& c0, at::TensorList weights,
                            bool has_biases) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("conveyor::fused_lstm", "").typed<ForwardFn>();
  return op.call(input, h0, c0, weights, has_biases);
}

LstmOutputsWithWorkspace call_fused_lstm_with_workspace(const at::Tensor& input, const at::Tensor& h0,
                                                        const at::Tensor& c0, at::TensorList weights, bool has_biases) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("conveyor::fused_lstm_with_workspace", "")
                             .typed<ForwardWithWorkspaceFn>();
  return op.call(input, h0, c0, weights, has_biases);
}

LstmGradients call_fused_lstm_backward(const std::optional<at::Tensor>& grad_output,
                                       const std::optional<at::Tensor>& grad_h_n,
                                       const std::optional<at::Tensor>& grad_c_n, const at::Tensor& input,
                                       const at::Tensor& h0, const at::Tensor& c0, at::TensorList weights,
                                       bool has_biases, const at::Tensor& output, const at::Tensor& gates,
                                       const at::Tensor& cells, const at::Tensor& hiddens) {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("conveyor::fused_lstm_backward", "").typed<BackwardFn>();
  return op.call(grad_output, grad_h_n, grad_c_n, input, h0, c0, weights, has_biases, output, gates, cells, hiddens);
}

}  // namespace lstm
}  // namespace conveyor
