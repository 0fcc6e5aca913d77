#pragma once
// The first persistent forward kernel, kept as the kernel variant "v1" until
// the GPU sweep (scripts/gpu.sh) has measured it against its successor
// (lstm_persistent_kernel.cuh): one cooperative launch runs a layer's whole
// time loop. Block k owns hidden units [k*U, (k+1)*U) and keeps their 4*U rows
// of W_hh in shared memory for all T steps. Each step a block copies h_{t-1}
// (written by every block in the step before) into shared memory, one warp per
// (batch row, unit) forms the four gate sums with scalar multiply-adds, and
// lane 0 applies the cell update; a grid-wide sync separates the steps. The
// launcher is lstm_persistent_kernel.cu; host_emulation/ runs this code on the CPU.
#include "ops/fused_lstm/cuda/lstm_cell_math.cuh"
#include "ops/fused_lstm/cuda/lstm_kernels.h"

#include <cooperative_groups.h>

#include <cstddef>
#include <cstdint>

namespace conveyor::lstm::cuda::persistent_warp {

constexpr int kThreads = 256;
// Beyond this batch the per-step kernel has enough parallelism of its own,
// and h_{t-1} would crowd W_hh out of shared memory.
constexpr int kMaxBatch = 32;

__host__ __device__ constexpr size_t align16(size_t bytes) { return (bytes + 15) / 16 * 16; }

template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    lstm_forward_persistent_kernel(ForwardSequence<scalar_t> s, int units_per_block) {
  using acc_t = AccOf<scalar_t>;
  namespace cg = cooperative_groups;
  cg::grid_group grid = cg::this_grid();
  CONVEYOR_DYNAMIC_SHARED_MEMORY(shared_bytes);
  const int H = s.hidden;
  const int B = s.batch;
  const size_t w_elems = static_cast<size_t>(4) * units_per_block * H;
  scalar_t* w_s = reinterpret_cast<scalar_t*>(shared_bytes);                                  // [4][U][H]
  acc_t* h_s = reinterpret_cast<acc_t*>(shared_bytes + align16(w_elems * sizeof(scalar_t)));  // [B][H]

  const int unit0 = blockIdx.x * units_per_block;
  const int n_units = min(units_per_block, H - unit0);
  for (size_t e = threadIdx.x; e < w_elems; e += blockDim.x) {
    const int k = static_cast<int>(e % H);
    const int row = static_cast<int>(e / H);
    const int g = row / units_per_block;
    const int uu = row % units_per_block;
    w_s[e] =
        uu < n_units ? s.w_hh[(static_cast<int64_t>(g) * H + unit0 + uu) * H + k] : static_cast<scalar_t>(acc_t(0));
  }

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int n_warps = blockDim.x / 32;
  const int64_t BH = static_cast<int64_t>(B) * H;
  for (int t = 0; t < s.seq_len; ++t) {
    const scalar_t* h_prev = t == 0 ? s.h0 : s.hs + (t - 1) * BH;
    for (int64_t e = threadIdx.x; e < BH; e += blockDim.x) h_s[e] = static_cast<acc_t>(load_cg(h_prev + e));
    __syncthreads();

    // The (b, unit) -> warp assignment is the same every step, so the lane
    // that reads c_{t-1} below is the one that wrote it.
    for (int item = warp; item < B * n_units; item += n_warps) {
      const int b = item / n_units;
      const int uu = item % n_units;
      const int j = unit0 + uu;
      const acc_t* h_row = h_s + static_cast<int64_t>(b) * H;
      acc_t acc[4] = {acc_t(0), acc_t(0), acc_t(0), acc_t(0)};
      for (int k = lane; k < H; k += 32) {
        const acc_t hv = h_row[k];
#pragma unroll
        for (int g = 0; g < 4; ++g) {
          acc[g] += static_cast<acc_t>(w_s[(static_cast<int64_t>(g) * units_per_block + uu) * H + k]) * hv;
        }
      }
#pragma unroll
      for (int g = 0; g < 4; ++g) acc[g] = warp_sum(acc[g]);
      if (lane == 0) {
        const int64_t gate_row = (static_cast<int64_t>(t) * B + b) * 4 * H;
        const int64_t bj = static_cast<int64_t>(b) * H + j;
        acc_t pre[4];
#pragma unroll
        for (int g = 0; g < 4; ++g) {
          pre[g] = acc[g] + static_cast<acc_t>(s.xproj[gate_row + g * H + j]) + (s.bias ? s.bias[g * H + j] : acc_t(0));
        }
        const acc_t c_prev = t == 0 ? s.c0[bj] : s.cells[(t - 1) * BH + bj];
        const CellResult<acc_t> cell = lstm_cell(pre, c_prev);
        s.cells[t * BH + bj] = cell.c;
        s.hs[t * BH + bj] = static_cast<scalar_t>(cell.h);
        if (s.gates) {
          s.gates[gate_row + j] = cell.i;
          s.gates[gate_row + H + j] = cell.f;
          s.gates[gate_row + 2 * H + j] = cell.g;
          s.gates[gate_row + 3 * H + j] = cell.o;
        }
      }
    }
    grid.sync();  // h_t complete everywhere before any block reads it
  }
}

// How the launcher lays a layer out on `sms` multiprocessors: one block per
// SM, each owning an equal slice of the hidden units (the last block the
// rest), and the shared memory a block needs for its W_hh rows and h_{t-1}.
struct Plan {
  int units_per_block = 0, blocks = 0;
  size_t shared_bytes = 0;
};
template <typename scalar_t>
Plan plan(int hidden, int batch, int sms) {
  Plan p;
  p.units_per_block = (hidden + sms - 1) / sms;
  p.blocks = (hidden + p.units_per_block - 1) / p.units_per_block;
  p.shared_bytes = align16(static_cast<size_t>(4) * p.units_per_block * hidden * sizeof(scalar_t)) +
                   static_cast<size_t>(batch) * hidden * sizeof(AccOf<scalar_t>);
  return p;
}

}  // namespace conveyor::lstm::cuda::persistent_warp
