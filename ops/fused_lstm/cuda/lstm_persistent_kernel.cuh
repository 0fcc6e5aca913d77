#pragma once
// The persistent LSTM kernels: one cooperative launch runs a layer's whole
// time loop, forward or backward, with the grid synchronised once a step.
//
// Block k owns hidden units [k*U, (k+1)*U) (the last block the rest) and keeps
// the part of W_hh those units need in shared memory for all T steps, so W_hh
// is read from global memory once a layer instead of once a step:
//   forward:  the units' 4U gate rows, times h_{t-1} (H long);
//   backward: the units' U columns, times dgates_{t+1} (4H long), which gives
//             the gradient reaching h_t through step t+1.
// Each step the block stages the shared vector (written by every block the
// step before) and forms its product (lstm_block_product.cuh: tensor cores
// for 16-bit and TF32 operands, else scalar); then every thread takes (unit,
// batch entry) pairs for the cell update, or its gradient, keeping c (or
// dL/dc) in shared memory from step to step. Launchers:
// lstm_persistent_kernel.cu; host_emulation/ runs this code on the CPU.
#include "ops/fused_lstm/cuda/lstm_block_product.cuh"
#include "ops/fused_lstm/cuda/lstm_cell_math.cuh"
#include "ops/fused_lstm/cuda/lstm_kernels.h"

#include <cooperative_groups.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace conveyor::lstm::cuda::persistent {

using block::kThreads;

// How a launch lays a layer out: U units a block over `blocks` blocks, and
// the block's shared memory (layout.bytes == 0: it does not fit).
struct Plan {
  int units_per_block = 0, blocks = 0;
  block::Layout layout;
};

// The fewest units a block may own to cover `hidden` with `sms` blocks, one a
// multiprocessor; tensor-core plans start from `tile_units` (a full M tile of
// rows) and halve it while the slice does not fit.
template <typename scalar_t, Math math>
Plan plan(int hidden, int batch, int sms, size_t shared_limit, bool backward) {
  using acc_t = AccOf<scalar_t>;
  const int least = (hidden + sms - 1) / sms;
  const int tile_units = math == Math::kFma ? 1 : (backward ? 16 : 4);  // backward rows = U, forward = 4U
  int u = std::min(hidden, std::max(least, tile_units));
  Plan p;
  for (;;) {
    const int rows = backward ? u : 4 * u;
    const int k = backward ? 4 * hidden : hidden;
    const size_t state = static_cast<size_t>(u) * batch * sizeof(acc_t);
    p.layout = block::layout<scalar_t, math>(rows, k, batch, state, shared_limit);
    if (p.layout.bytes != 0 || u <= least) break;
    u = std::max(least, u / 2);
  }
  p.units_per_block = u;
  p.blocks = (hidden + u - 1) / u;
  return p;
}

template <typename scalar_t, Math math>
__global__ void __launch_bounds__(kThreads, 1)  // one block a multiprocessor: all its registers
    lstm_forward_persistent_kernel(ForwardSequence<scalar_t> s, int units_per_block, block::Layout l) {
  using acc_t = AccOf<scalar_t>;
  namespace cg = cooperative_groups;
  cg::grid_group grid = cg::this_grid();
  CONVEYOR_DYNAMIC_SHARED_MEMORY(smem);
  const int H = s.hidden, B = s.batch, U = units_per_block;
  const int unit0 = blockIdx.x * U;
  const int n_units = min(U, H - unit0);
  // Row g*U + u of the slice is W_hh's row g*H + unit0 + u.
  block::load_a<scalar_t, math>(l, smem, false, [&](int row, int k) {
    const int g = row / U, u = row % U;
    return u < n_units ? s.w_hh[(static_cast<int64_t>(g) * H + unit0 + u) * H + k] : static_cast<scalar_t>(0.0f);
  });
  // c of this block's (unit, batch) pairs; pair e is thread e % blockDim.x's every step.
  acc_t* c_state = block::at_offset<acc_t>(smem, l.state_offset);
  const int pairs = n_units * B;
  for (int e = threadIdx.x; e < pairs; e += blockDim.x) {
    c_state[e] = s.c0[static_cast<int64_t>(e / n_units) * H + unit0 + e % n_units];
  }

  const int64_t BH = static_cast<int64_t>(B) * H;
  // A pair's gate inputs that do not wait for h_{t-1}: x_t W_ih^T + bias.
  auto inputs = [&](int t, int e, acc_t (&in)[4]) {
    const int j = unit0 + e % n_units;
    const int64_t gate_row = (static_cast<int64_t>(t) * B + e / n_units) * 4 * H;
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      in[g] = static_cast<acc_t>(s.xproj[gate_row + g * H + j]) + (s.bias ? s.bias[g * H + j] : acc_t(0));
    }
  };
  for (int t = 0; t < s.seq_len; ++t) {
    // This thread's first pair's inputs, loaded before the product so that
    // their trip to memory overlaps it.
    acc_t first[4];
    if (threadIdx.x < pairs) inputs(t, threadIdx.x, first);
    const scalar_t* h_prev = t == 0 ? s.h0 : s.hs + (t - 1) * BH;
    block::multiply<scalar_t, math>(l, smem, [&](int b, int k) { return load_cg(h_prev + b * H + k); });
    for (int e = threadIdx.x; e < pairs; e += blockDim.x) {
      const int u = e % n_units, b = e / n_units, j = unit0 + u;
      acc_t pre[4];
      if (e == static_cast<int>(threadIdx.x)) {
#pragma unroll
        for (int g = 0; g < 4; ++g) pre[g] = first[g];
      } else {
        inputs(t, e, pre);
      }
#pragma unroll
      for (int g = 0; g < 4; ++g) pre[g] += block::product<acc_t>(l, smem, g * U + u, b);
      const CellResult<acc_t> cell = lstm_cell(pre, c_state[e]);
      c_state[e] = cell.c;
      const int64_t at = t * BH + static_cast<int64_t>(b) * H + j;
      s.cells[at] = cell.c;
      s.hs[at] = static_cast<scalar_t>(cell.h);
      if (s.gates) {
        const int64_t gate_row = (static_cast<int64_t>(t) * B + b) * 4 * H;
        s.gates[gate_row + j] = cell.i;
        s.gates[gate_row + H + j] = cell.f;
        s.gates[gate_row + 2 * H + j] = cell.g;
        s.gates[gate_row + 3 * H + j] = cell.o;
      }
    }
    grid.sync();  // h_t complete everywhere before any block stages it
  }
}

template <typename scalar_t, Math math>
__global__ void __launch_bounds__(kThreads, 1)  // one block a multiprocessor: all its registers
    lstm_backward_persistent_kernel(BackwardSequence<scalar_t> s, int units_per_block, block::Layout l) {
  using acc_t = AccOf<scalar_t>;
  namespace cg = cooperative_groups;
  cg::grid_group grid = cg::this_grid();
  CONVEYOR_DYNAMIC_SHARED_MEMORY(smem);
  const int H = s.hidden, B = s.batch, U = units_per_block, G = 4 * H;
  const int unit0 = blockIdx.x * U;
  const int n_units = min(U, H - unit0);
  // Row u of the slice is W_hh's column unit0 + u (k runs over W_hh's 4H rows).
  block::load_a<scalar_t, math>(l, smem, true, [&](int row, int k) {
    return row < n_units ? s.w_hh[static_cast<int64_t>(k) * H + unit0 + row] : static_cast<scalar_t>(0.0f);
  });
  // dL/dc_t of this block's (unit, batch) pairs, carried from step to step.
  acc_t* dc_state = block::at_offset<acc_t>(smem, l.state_offset);
  const int pairs = n_units * B;
  for (int e = threadIdx.x; e < pairs; e += blockDim.x) {
    dc_state[e] = s.dc[static_cast<int64_t>(e / n_units) * H + unit0 + e % n_units];
  }

  const int64_t BH = static_cast<int64_t>(B) * H;
  // What a pair's step needs besides the product: the saved gates and cells,
  // and the gradient arriving from the output (and from h_n at the last step).
  struct Saved {
    acc_t i, f, g, o, c, c_prev, dh;
  };
  auto saved = [&](int t, int e) {
    const int j = unit0 + e % n_units;
    const int64_t bj = static_cast<int64_t>(e / n_units) * H + j, at = t * BH + bj;
    const int64_t gate_row = (t * BH + bj - j) * 4;
    Saved v;
    v.i = s.gates[gate_row + j], v.f = s.gates[gate_row + H + j];
    v.g = s.gates[gate_row + 2 * H + j], v.o = s.gates[gate_row + 3 * H + j];
    v.c = s.cells[at];
    v.c_prev = t > 0 ? s.cells[at - BH] : s.c0[bj];
    v.dh = (s.dh_seq ? static_cast<acc_t>(s.dh_seq[at]) : acc_t(0)) +
           (t + 1 == s.seq_len && s.dh_last ? s.dh_last[bj] : acc_t(0));
    return v;
  };
  for (int t = s.seq_len - 1; t >= 0; --t) {
    const bool recurrent = t + 1 < s.seq_len;
    // This thread's first pair's, loaded before the product to overlap it.
    Saved first{};
    if (threadIdx.x < pairs) first = saved(t, threadIdx.x);
    if (recurrent) {
      const acc_t* next = s.dgates + (t + 1) * BH * 4;
      block::multiply<scalar_t, math>(l, smem, [&](int b, int k) { return load_cg(next + b * G + k); });
    }
    for (int e = threadIdx.x; e < pairs; e += blockDim.x) {
      const int u = e % n_units, b = e / n_units, j = unit0 + u;
      const Saved v = e == static_cast<int>(threadIdx.x) ? first : saved(t, e);
      const acc_t dh = v.dh + (recurrent ? block::product<acc_t>(l, smem, u, b) : acc_t(0));
      const acc_t tanh_c = tanh_acc(v.c);
      const acc_t dc = dc_state[e] + dh * v.o * (acc_t(1) - tanh_c * tanh_c);
      const int64_t gate_row = (static_cast<int64_t>(t) * B + b) * G;
      s.dgates[gate_row + j] = dc * v.g * v.i * (acc_t(1) - v.i);
      s.dgates[gate_row + H + j] = dc * v.c_prev * v.f * (acc_t(1) - v.f);
      s.dgates[gate_row + 2 * H + j] = dc * v.i * (acc_t(1) - v.g * v.g);
      s.dgates[gate_row + 3 * H + j] = dh * tanh_c * v.o * (acc_t(1) - v.o);
      dc_state[e] = dc * v.f;
    }
    grid.sync();  // dgates_t complete everywhere before any block stages it
  }
  for (int e = threadIdx.x; e < pairs; e += blockDim.x) {
    s.dc[static_cast<int64_t>(e / n_units) * H + unit0 + e % n_units] = dc_state[e];
  }
}

}  // namespace conveyor::lstm::cuda::persistent
