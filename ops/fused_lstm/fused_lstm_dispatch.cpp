// lstm_layers: the one place where an LSTM call of FusedLSTM or of a swapped
// TorchScript aten::lstm picks the fused kernel or at::lstm (cuDNN on CUDA),
// per ops/dispatch/fused_dispatch.h.
#include "ops/dispatch/fused_dispatch.h"
#include "ops/fused_lstm/fused_lstm.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace conveyor {
namespace {

bool records_autograd(const at::Tensor& input, const at::Tensor& h0, const at::Tensor& c0, at::TensorList weights) {
  if (!at::GradMode::is_enabled()) return false;
  if (input.requires_grad() || h0.requires_grad() || c0.requires_grad()) return true;
  for (const auto& w : weights) {
    if (w.requires_grad()) return true;
  }
  return false;
}

}  // namespace

bool fused_lstm_kernel_available(const c10::Device& device, c10::ScalarType dtype) {
  static const bool cuda_kernel = has_cuda_kernel("conveyor::fused_lstm");
  return fused_kernel_can_run(cuda_kernel, device, dtype);
}

DispatchChoice lstm_path(const at::Tensor& input, const at::Tensor& h0, const at::Tensor& c0, at::TensorList weights,
                         int64_t num_layers) {
  DispatchQuery query{"lstm", input.device(), input.scalar_type(), {}, {"train"}};
  query.shape = {{"seq", static_cast<double>(input.size(0))},
                 {"batch", static_cast<double>(input.size(1))},
                 {"input", static_cast<double>(input.size(2))},
                 {"hidden", static_cast<double>(h0.size(-1))},
                 {"layers", static_cast<double>(num_layers)},
                 {"train", records_autograd(input, h0, c0, weights) ? 1.0 : 0.0}};
  return choose_fused_path(query, fused_lstm_kernel_available(input.device(), input.scalar_type()));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_layers(const at::Tensor& input, const at::Tensor& h0,
                                                           const at::Tensor& c0, at::TensorList weights,
                                                           bool has_biases, int64_t num_layers, double dropout,
                                                           bool train) {
  if (lstm_path(input, h0, c0, weights, num_layers).path == FusedPath::kFused) {
    return fused_lstm_layers(input, h0, c0, weights, has_biases, num_layers, dropout, train);
  }
  return at::lstm(input, {h0, c0}, weights, has_biases, num_layers, dropout, train, /*bidirectional=*/false,
                  /*batch_first=*/false);
}

}  // namespace conveyor
