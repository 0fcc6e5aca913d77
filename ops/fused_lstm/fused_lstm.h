#pragma once
// conveyor::fused_lstm: a multi-layer unidirectional LSTM with the gate order
// and arithmetic of torch::nn::LSTM (gates i, f, g, o), forward and backward.
//
//   input   [T, B, I]  time-major
//   h0, c0  [L, B, H]
//   weights torch::nn::LSTM's flat order: weight_ih_l0 [4H, I], weight_hh_l0
//           [4H, H], bias_ih_l0 [4H], bias_hh_l0 [4H], weight_ih_l1, ...
//           (the biases only when has_biases)
//   returns (output [T, B, H], h_n [L, B, H], c_n [L, B, H])
//
// Kernels: CPU (a reference written with ATen ops; float64, float32, and
// bfloat16/float16 computed in float32) and CUDA (float32, bfloat16, float16,
// float64, accumulating in float32 or float64). Differentiable: the backward
// is the op conveyor::fused_lstm_backward. From Python, after
// torch.ops.load_library(path): torch.ops.conveyor.fused_lstm(...).
//
// The module that uses it is conveyor::FusedLSTM (fused_lstm_module.h).

#include "ops/dispatch/fused_dispatch.h"

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <string>
#include <tuple>

namespace conveyor {

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm(const at::Tensor& input, const at::Tensor& h0,
                                                          const at::Tensor& c0, at::TensorList weights,
                                                          bool has_biases);

// fused_lstm over `num_layers` layers, with dropout of probability `dropout`
// on the output of every layer but the last when `train` (one op call per
// layer then; the mask is drawn with at::dropout, as torch::nn::LSTM does).
// Shapes as fused_lstm's: time-major input, [L, B, H] states.
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_layers(const at::Tensor& input, const at::Tensor& h0,
                                                                 const at::Tensor& c0, at::TensorList weights,
                                                                 bool has_biases, int64_t num_layers, double dropout,
                                                                 bool train);

// The LSTM that FusedLSTM and the swapped aten::lstm run: fused_lstm_layers or
// at::lstm (cuDNN on CUDA), whichever the dispatch table says is faster for
// this device, dtype and shape (ops/dispatch/fused_dispatch.h). Same
// arguments and results as fused_lstm_layers.
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_layers(const at::Tensor& input, const at::Tensor& h0,
                                                           const at::Tensor& c0, at::TensorList weights,
                                                           bool has_biases, int64_t num_layers, double dropout,
                                                           bool train);

// lstm_layers on the path already chosen (lstm_path).
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_layers_on(FusedPath path, const at::Tensor& input,
                                                              const at::Tensor& h0, const at::Tensor& c0,
                                                              at::TensorList weights, bool has_biases,
                                                              int64_t num_layers, double dropout, bool train);

// The choice lstm_layers makes for these arguments, with its reason.
DispatchChoice lstm_path(const at::Tensor& input, const at::Tensor& h0, const at::Tensor& c0, at::TensorList weights,
                         int64_t num_layers);

// Whether this build has a fused LSTM kernel for the device and dtype.
bool fused_lstm_kernel_available(const c10::Device& device, c10::ScalarType dtype);

// The CUDA kernels of a fused LSTM call, as the dispatch table names them
// (fused_kernel_names("lstm"), described in ops/dispatch/fused_dispatch.h).
enum class LstmKernel {
  kPersistent,     // "persistent"
  kPersistentFma,  // "persistent_fma"
  kV1,             // "v1"
  kStep,           // "step"
};
// Throws std::invalid_argument for a name that is not one of them.
LstmKernel lstm_kernel_named(const std::string& name);

// Whether the fused kernels may compute float32 recurrent products in TF32:
// what PyTorch allows cuDNN's RNNs (torch.backends.cudnn.rnn.fp32_precision,
// or the older torch.backends.cudnn.allow_tf32; on by default), since the
// kernels stand in for cuDNN's LSTM.
bool lstm_allows_tf32();

// The shape of an LSTM call as the dispatch table keys it (fused_dispatch.h).
struct LstmShape {
  int64_t seq = 0, batch = 0, input = 0, hidden = 0, layers = 0;
  bool train = false;  // autograd records the call
};
DispatchQuery lstm_query(const c10::Device& device, c10::ScalarType dtype, const LstmShape& shape);
// The kernel a fused call of this shape runs (fused_kernel).
LstmKernel lstm_kernel(const c10::Device& device, c10::ScalarType dtype, const LstmShape& shape);

}  // namespace conveyor
