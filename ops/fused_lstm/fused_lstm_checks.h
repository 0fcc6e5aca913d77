#pragma once
// Argument checks shared by every fused_lstm kernel (CPU and CUDA), and the
// unpacked view of the arguments that the layer driver works on.
//
// The weights arrive flat, in torch::nn::LSTM's order:
//   weight_ih_l0, weight_hh_l0, [bias_ih_l0, bias_hh_l0,] weight_ih_l1, ...
// so the number of layers is implied by the list length and has_biases.

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace conveyor::lstm {

struct LayerWeights {
  at::Tensor w_ih;  // [4H, in]
  at::Tensor w_hh;  // [4H, H]
  at::Tensor b_ih;  // [4H], undefined without biases
  at::Tensor b_hh;  // [4H], undefined without biases
};

// The checked, contiguous arguments of one fused_lstm call.
struct LstmArgs {
  at::Tensor input;  // [T, B, I] time-major
  at::Tensor h0;     // [L, B, H]
  at::Tensor c0;     // [L, B, H]
  std::vector<LayerWeights> layers;
  bool has_biases = true;
  int64_t seq_len = 0;
  int64_t batch = 0;
  int64_t input_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
};

// Checks ranks, shapes, dtypes and devices (messages name the argument and the
// dimension at fault) and returns contiguous copies where needed.
LstmArgs check_lstm_args(const at::Tensor& input, const at::Tensor& h0, const at::Tensor& c0, at::TensorList weights,
                         bool has_biases, const char* op);

// The tensors the forward pass keeps for the backward pass. `gates` holds the
// activated gates (i, f, g, o), `cells` every cell state c_t, `hiddens` the
// output sequence of every layer but the last (the last one is `output`).
struct LstmWorkspace {
  at::Tensor gates;    // [L, T, B, 4H], accumulation dtype
  at::Tensor cells;    // [L, T, B, H], accumulation dtype
  at::Tensor hiddens;  // [L-1, T, B, H]
};

// Checks the extra arguments of fused_lstm_backward against the unpacked call.
void check_backward_args(const LstmArgs& args, const std::optional<at::Tensor>& grad_output,
                         const std::optional<at::Tensor>& grad_h_n, const std::optional<at::Tensor>& grad_c_n,
                         const at::Tensor& output, const LstmWorkspace& workspace);

// float64 computes in float64; every other dtype accumulates in float32.
at::ScalarType accumulation_dtype(at::ScalarType dtype);

}  // namespace conveyor::lstm
