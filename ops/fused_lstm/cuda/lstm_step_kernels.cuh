#pragma once
// The per-time-step fused kernels of the LSTM, forward and backward.
//
// Both are tiled the same way: a block of 32 x 8 threads owns 32 hidden units
// and 8 batch rows; each thread computes one (batch row, hidden unit) pair.
// The reduction runs in chunks of 32 through shared memory. A thread holds the
// sums of all four gates of its unit, so the cell update needs no exchange
// between threads and is done in the same kernel. The launchers are in
// lstm_step_kernels.cu; host_emulation/ runs this code on the CPU.
#include "ops/fused_lstm/cuda/lstm_cell_math.cuh"
#include "ops/fused_lstm/cuda/lstm_kernels.h"

#include <cstdint>

namespace conveyor::lstm::cuda::step {

constexpr int kTileUnits = 32;  // hidden units per block (threadIdx.x)
constexpr int kTileBatch = 8;   // batch rows per block (threadIdx.y)
constexpr int kTileK = 32;      // reduction chunk
constexpr int kThreads = kTileUnits * kTileBatch;

dim3 step_grid(int batch, int hidden) {
  return dim3((hidden + kTileUnits - 1) / kTileUnits, (batch + kTileBatch - 1) / kTileBatch);
}

template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) lstm_forward_step_kernel(ForwardStep<scalar_t> s) {
  using acc_t = AccOf<scalar_t>;
  // +1 column: threads of a warp read different units of the same k.
  __shared__ acc_t w_tile[4][kTileUnits][kTileK + 1];
  __shared__ acc_t h_tile[kTileBatch][kTileK];
  const int H = s.hidden;
  const int B = s.batch;
  const int u = threadIdx.x;
  const int r = threadIdx.y;
  const int tid = r * kTileUnits + u;
  const int j0 = blockIdx.x * kTileUnits;
  const int b0 = blockIdx.y * kTileBatch;

  acc_t acc[4] = {acc_t(0), acc_t(0), acc_t(0), acc_t(0)};
  for (int k0 = 0; k0 < H; k0 += kTileK) {
    for (int e = tid; e < 4 * kTileUnits * kTileK; e += kThreads) {
      const int kk = e % kTileK;
      const int row = e / kTileK;
      const int g = row / kTileUnits;
      const int uu = row % kTileUnits;
      const int j = j0 + uu;
      const int k = k0 + kk;
      w_tile[g][uu][kk] =
          (j < H && k < H) ? static_cast<acc_t>(s.w_hh[(static_cast<int64_t>(g) * H + j) * H + k]) : acc_t(0);
    }
    for (int e = tid; e < kTileBatch * kTileK; e += kThreads) {
      const int kk = e % kTileK;
      const int rr = e / kTileK;
      const int b = b0 + rr;
      const int k = k0 + kk;
      h_tile[rr][kk] = (b < B && k < H) ? static_cast<acc_t>(s.h_prev[static_cast<int64_t>(b) * H + k]) : acc_t(0);
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kTileK; ++kk) {
      const acc_t hv = h_tile[r][kk];
#pragma unroll
      for (int g = 0; g < 4; ++g) acc[g] += w_tile[g][u][kk] * hv;
    }
    __syncthreads();
  }

  const int j = j0 + u;
  const int b = b0 + r;
  if (j >= H || b >= B) return;
  const int64_t gate_row = static_cast<int64_t>(b) * 4 * H;
  acc_t pre[4];
#pragma unroll
  for (int g = 0; g < 4; ++g) {
    pre[g] = acc[g] + static_cast<acc_t>(s.xproj_t[gate_row + g * H + j]) + (s.bias ? s.bias[g * H + j] : acc_t(0));
  }
  const int64_t bj = static_cast<int64_t>(b) * H + j;
  const CellResult<acc_t> cell = lstm_cell(pre, s.c_prev[bj]);
  s.c_out[bj] = cell.c;
  s.h_out[bj] = static_cast<scalar_t>(cell.h);
  if (s.gates_out) {
    s.gates_out[gate_row + j] = cell.i;
    s.gates_out[gate_row + H + j] = cell.f;
    s.gates_out[gate_row + 2 * H + j] = cell.g;
    s.gates_out[gate_row + 3 * H + j] = cell.o;
  }
}

template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) lstm_backward_step_kernel(BackwardStep<scalar_t> s) {
  using acc_t = AccOf<scalar_t>;
  __shared__ acc_t w_tile[kTileK][kTileUnits];  // rows k of W_hh, columns = this block's units
  __shared__ acc_t g_tile[kTileBatch][kTileK];  // dgates_{t+1}
  const int H = s.hidden;
  const int B = s.batch;
  const int K = 4 * H;
  const int u = threadIdx.x;
  const int r = threadIdx.y;
  const int tid = r * kTileUnits + u;
  const int j0 = blockIdx.x * kTileUnits;
  const int b0 = blockIdx.y * kTileBatch;

  // (dgates_{t+1} W_hh)[b, j]: the gradient reaching h_t through step t+1.
  acc_t recurrent = acc_t(0);
  if (s.dgates_next != nullptr) {
    for (int k0 = 0; k0 < K; k0 += kTileK) {
      for (int e = tid; e < kTileK * kTileUnits; e += kThreads) {
        const int uu = e % kTileUnits;
        const int kk = e / kTileUnits;
        const int j = j0 + uu;
        const int k = k0 + kk;
        w_tile[kk][uu] = (j < H && k < K) ? static_cast<acc_t>(s.w_hh[static_cast<int64_t>(k) * H + j]) : acc_t(0);
      }
      for (int e = tid; e < kTileBatch * kTileK; e += kThreads) {
        const int kk = e % kTileK;
        const int rr = e / kTileK;
        const int b = b0 + rr;
        const int k = k0 + kk;
        g_tile[rr][kk] = (b < B && k < K) ? s.dgates_next[static_cast<int64_t>(b) * K + k] : acc_t(0);
      }
      __syncthreads();
#pragma unroll 8
      for (int kk = 0; kk < kTileK; ++kk) recurrent += w_tile[kk][u] * g_tile[r][kk];
      __syncthreads();
    }
  }

  const int j = j0 + u;
  const int b = b0 + r;
  if (j >= H || b >= B) return;
  const int64_t bj = static_cast<int64_t>(b) * H + j;
  const int64_t gate_row = static_cast<int64_t>(b) * K;
  acc_t dh = recurrent;
  if (s.dgates_next == nullptr && s.dh_last != nullptr) dh = s.dh_last[bj];
  if (s.dh_out_t != nullptr) dh += static_cast<acc_t>(s.dh_out_t[bj]);

  const acc_t i = s.gates_t[gate_row + j];
  const acc_t f = s.gates_t[gate_row + H + j];
  const acc_t g = s.gates_t[gate_row + 2 * H + j];
  const acc_t o = s.gates_t[gate_row + 3 * H + j];
  const acc_t tanh_c = tanh_acc(s.c_t[bj]);
  const acc_t dc = s.dc[bj] + dh * o * (acc_t(1) - tanh_c * tanh_c);
  s.dgates_t[gate_row + j] = dc * g * i * (acc_t(1) - i);
  s.dgates_t[gate_row + H + j] = dc * s.c_prev[bj] * f * (acc_t(1) - f);
  s.dgates_t[gate_row + 2 * H + j] = dc * i * (acc_t(1) - g * g);
  s.dgates_t[gate_row + 3 * H + j] = dh * tanh_c * o * (acc_t(1) - o);
  s.dc[bj] = dc * f;
}

}  // namespace conveyor::lstm::cuda::step
