#pragma once
// The layer loop of the fused LSTM, shared by the CPU and CUDA kernels.
//
// Everything that is one big matrix product per layer is done here with ATen:
// the input projection of all time steps (one GEMM), and in the backward pass
// the weight gradients accumulated over time and the gradient of the layer
// input (three GEMMs). Only the sequential part, the time loop of one layer,
// is device specific and sits behind `Recurrence`.

#include "ops/fused_lstm/fused_lstm_checks.h"

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>
#include <vector>

namespace conveyor::lstm {

// One layer's forward time loop. Gates are ordered i, f, g, o as in torch::nn::LSTM.
struct LayerForward {
  at::Tensor xproj;  // [T, B, 4H] x_t W_ih^T for every t, without bias, input dtype
  at::Tensor bias;   // [4H] b_ih + b_hh in the accumulation dtype, or undefined
  at::Tensor w_hh;   // [4H, H]
  at::Tensor h0;     // [B, H] input dtype
  at::Tensor c0;     // [B, H] accumulation dtype
  at::Tensor hs;     // out: [T, B, H] input dtype, h_t
  at::Tensor cells;  // out: [T, B, H] accumulation dtype, c_t
  at::Tensor gates;  // out: [T, B, 4H] accumulation dtype, activated gates; undefined when not needed
};

// One layer's backward time loop: the gradients of the gate pre-activations.
struct LayerBackward {
  at::Tensor dh_seq;  // [T, B, H] gradient of this layer's output sequence, or undefined
  at::Tensor dh_n;    // [B, H] accumulation dtype, or undefined
  at::Tensor dc_n;    // [B, H] accumulation dtype, or undefined
  at::Tensor gates;   // [T, B, 4H] saved activated gates
  at::Tensor cells;   // [T, B, H] saved cell states
  at::Tensor c0;      // [B, H] accumulation dtype
  at::Tensor w_hh;    // [4H, H]
  at::Tensor dgates;  // out: [T, B, 4H] accumulation dtype
  at::Tensor dc0;     // out: [B, H] accumulation dtype
};

class Recurrence {
 public:
  virtual ~Recurrence() = default;
  virtual void forward(LayerForward& layer) = 0;
  virtual void backward(LayerBackward& layer) = 0;
};

struct ForwardResult {
  at::Tensor output;        // [T, B, H]
  at::Tensor h_n;           // [L, B, H]
  at::Tensor c_n;           // [L, B, H]
  LstmWorkspace workspace;  // filled only when asked for
};

ForwardResult run_forward(const LstmArgs& args, Recurrence& recurrence, bool keep_workspace);

struct BackwardResult {
  at::Tensor grad_input;                 // [T, B, I]
  at::Tensor grad_h0;                    // [L, B, H]
  at::Tensor grad_c0;                    // [L, B, H]
  std::vector<at::Tensor> grad_weights;  // same order as the weights
};

BackwardResult run_backward(const LstmArgs& args, const std::optional<at::Tensor>& grad_output,
                            const std::optional<at::Tensor>& grad_h_n, const std::optional<at::Tensor>& grad_c_n,
                            const at::Tensor& output, const LstmWorkspace& workspace, Recurrence& recurrence);

}  // namespace conveyor::lstm
