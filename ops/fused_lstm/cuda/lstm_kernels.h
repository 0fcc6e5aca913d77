#pragma once
// Launchers of the fused LSTM's CUDA kernels, on raw device pointers.
//
// Instantiated for float, double, c10::Half and c10::BFloat16; the gates, the
// cell state and all sums are kept in AccOf<scalar_t> (float, or double for
// double). Every launcher checks its launch. Shapes: B = batch, H = hidden
// size; matrices are row-major and contiguous; gate order is i, f, g, o.

#include <cuda_runtime_api.h>

#include <type_traits>

namespace conveyor::lstm::cuda {

template <typename scalar_t>
using AccOf = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;

// One forward time step: the recurrent GEMM h_{t-1} W_hh^T, the bias, the
// gate nonlinearities and the cell update, in one kernel.
template <typename scalar_t>
struct ForwardStep {
  using acc_t = AccOf<scalar_t>;
  const scalar_t* xproj_t = nullptr;  // [B, 4H] x_t W_ih^T
  const acc_t* bias = nullptr;        // [4H] b_ih + b_hh, or null
  const scalar_t* w_hh = nullptr;     // [4H, H]
  const scalar_t* h_prev = nullptr;   // [B, H]
  const acc_t* c_prev = nullptr;      // [B, H]
  scalar_t* h_out = nullptr;          // [B, H]
  acc_t* c_out = nullptr;             // [B, H]
  acc_t* gates_out = nullptr;         // [B, 4H] activated gates, or null
  int batch = 0;
  int hidden = 0;
};

template <typename scalar_t>
void launch_forward_step(const ForwardStep<scalar_t>& step, cudaStream_t stream);

// How a persistent kernel forms its recurrent product (lstm_block_product.cuh):
// scalar multiply-adds in the accumulation dtype, float16/bfloat16 tensor
// cores, or TF32 tensor cores for float32.
enum class Math { kFma, kMma16, kTf32 };

// A whole layer's forward time loop in one cooperative launch: each block
// keeps the W_hh rows of its slice of hidden units in shared memory across
// all time steps and the grid synchronises between steps.
template <typename scalar_t>
struct ForwardSequence {
  using acc_t = AccOf<scalar_t>;
  const scalar_t* xproj = nullptr;  // [T, B, 4H]
  const acc_t* bias = nullptr;      // [4H] or null
  const scalar_t* w_hh = nullptr;   // [4H, H]
  const scalar_t* h0 = nullptr;     // [B, H]
  const acc_t* c0 = nullptr;        // [B, H]
  scalar_t* hs = nullptr;           // [T, B, H]
  acc_t* cells = nullptr;           // [T, B, H]
  acc_t* gates = nullptr;           // [T, B, 4H] or null
  int seq_len = 0;
  int batch = 0;
  int hidden = 0;
};

// Launch a persistent kernel and return true when it fits on the current
// device (its W_hh slice and a pass of the shared vector in shared memory,
// every block co-resident); otherwise launch nothing and return false.
// lstm_persistent_kernel.cuh, with `math` as the product's arithmetic
// (kMma16 only for float16/bfloat16, kTf32 only for float32):
template <typename scalar_t>
bool try_launch_forward_persistent(const ForwardSequence<scalar_t>& seq, Math math, cudaStream_t stream);
// lstm_persistent_warp_kernel.cuh (the kernel variant "v1"; up to batch 32):
template <typename scalar_t>
bool try_launch_forward_persistent_warp(const ForwardSequence<scalar_t>& seq, cudaStream_t stream);

// One backward time step: dh_t = dh_seq[t] + dgates_{t+1} W_hh (or dh_n at the
// last step), then the gate-gradient and cell-gradient update, in one kernel.
template <typename scalar_t>
struct BackwardStep {
  using acc_t = AccOf<scalar_t>;
  const acc_t* dgates_next = nullptr;  // [B, 4H] gradients of step t+1, or null at t = T-1
  const scalar_t* w_hh = nullptr;      // [4H, H]
  const scalar_t* dh_out_t = nullptr;  // [B, H] gradient of h_t from the layer's output, or null
  const acc_t* dh_last = nullptr;      // [B, H] gradient of h_n, or null; used when dgates_next is null
  const acc_t* gates_t = nullptr;      // [B, 4H] saved activated gates
  const acc_t* c_t = nullptr;          // [B, H]
  const acc_t* c_prev = nullptr;       // [B, H]
  acc_t* dc = nullptr;                 // [B, H] in: dL/dc_t from later steps; out: dL/dc_{t-1}
  acc_t* dgates_t = nullptr;           // [B, 4H] out: gradients of the gate pre-activations
  int batch = 0;
  int hidden = 0;
};

template <typename scalar_t>
void launch_backward_step(const BackwardStep<scalar_t>& step, cudaStream_t stream);

// A whole layer's backward time loop in one cooperative launch, from t = T-1
// down to 0: each block keeps its units' columns of W_hh in shared memory,
// and each step forms dh_t = dh_seq[t] + dgates_{t+1} W_hh for its units
// (dh_last at t = T-1), then their gate gradients and dL/dc_{t-1}.
template <typename scalar_t>
struct BackwardSequence {
  using acc_t = AccOf<scalar_t>;
  const scalar_t* w_hh = nullptr;    // [4H, H]
  const scalar_t* dh_seq = nullptr;  // [T, B, H] gradient of the layer's output, or null
  const acc_t* dh_last = nullptr;    // [B, H] gradient of h_n, or null
  const acc_t* gates = nullptr;      // [T, B, 4H] saved activated gates
  const acc_t* cells = nullptr;      // [T, B, H] saved cell states
  const acc_t* c0 = nullptr;         // [B, H]
  acc_t* dc = nullptr;               // [B, H] in: dL/dc_n; out: dL/dc_0
  acc_t* dgates = nullptr;           // [T, B, 4H] out: gradients of the gate pre-activations
  int seq_len = 0;
  int batch = 0;
  int hidden = 0;
};

template <typename scalar_t>
bool try_launch_backward_persistent(const BackwardSequence<scalar_t>& seq, Math math, cudaStream_t stream);

}  // namespace conveyor::lstm::cuda
