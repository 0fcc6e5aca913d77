#pragma once
// Tensor-core attention forward with FlashAttention-2's tiles (the kernel
// variant "tiles128"; flash_forward_kernel.cuh is "v1" until a GPU has
// measured both): a CTA of 4 warps takes 128 query rows, 32 a warp (two m16
// row tiles that share every K and V fragment the warp loads), and walks the
// keys kBlockN at a time: 32 at head dim 128, 128 at head dim 64. K and V are
// double-buffered: block j+1's copies fly while block j is multiplied, with
// two barriers a block (v1 has four). Q stays in shared memory and is
// reloaded per block (in registers it would crowd out O at head dim 128).
//
// Scores stay raw (unscaled) in the accumulators; the row max is taken on
// them (the scale is positive) and each probability is one FMA and one
// ex2.approx: exp2(s * scale log2 e - max * scale log2 e), which needs
// scale > 0 (the binding sends other scales to v1). Key blocks the padding
// mask hides are skipped (its block flags read once a CTA), only edge blocks
// (the sequence's end, the causal diagonal, a partly padded block) test each
// score, and with causal masking the query blocks with the most keys are
// launched first within each (batch, head).

#include "ops/fused_attention/cuda/attention_kernels.h"
#include "ops/fused_attention/cuda/flash_forward_kernel.cuh"
#include "ops/fused_attention/cuda/warp_mma.cuh"

#include <cmath>

namespace conveyor::attention::cuda {

template <typename T, int kHeadDim_, int kBlockN_>
struct TilesForwardConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowTiles = 2;  // m16 row tiles a warp
  static constexpr int kBlockM = 16 * kRowTiles * kWarps;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStride = kHeadDim + 8;
  // Q, then two buffers of a K and a V tile each (double-buffered), then the
  // mask's block flags (forward_smem_bytes).
  static constexpr int kTileBytes = (kBlockM + 4 * kBlockN) * kStride * static_cast<int>(sizeof(T));
  static_assert(kHeadDim % 16 == 0 && kBlockN % 16 == 0, "tiles are made of 16x16 mma blocks");
};

// 128 x 128 at head dim 64; 128 x 32 at head dim 128, where 128 x 64 spills
// 264 bytes (O's accumulators alone take 128 registers a thread): ptxas_spills
// holds both to no spill.
template <typename T, int kHeadDim>
using TilesForwardConfigFor = TilesForwardConfig<T, kHeadDim, /*kBlockN=*/kHeadDim <= 64 ? 128 : 32>;

// The query block a CTA takes: with causal masking, the last (the one with
// the most keys to see) first, so the long ones do not finish the grid alone.
__device__ __forceinline__ int query_block(int x, int blocks, bool causal) { return causal ? blocks - 1 - x : x; }

template <typename T, typename Config>
__global__ void __launch_bounds__(Config::kThreads) flash_forward_tiles_kernel(const ForwardParams p) {
  constexpr int D = Config::kHeadDim, BM = Config::kBlockM, BN = Config::kBlockN, kStride = Config::kStride;
  constexpr int kThreads = Config::kThreads, RT = Config::kRowTiles;
  constexpr int kUnrollQ = D > 64 ? 1 : D / 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Q, then buffers 0 and 1, each a K tile and a V tile.
  T* sQ = reinterpret_cast<T*>(smem_raw);
  auto sK = [&](int buffer) { return sQ + (BM + 2 * BN * buffer) * kStride; };
  auto sV = [&](int buffer) { return sQ + (BM + 2 * BN * buffer + BN) * kStride; };

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const int m0 = query_block(blockIdx.x, gridDim.x, p.causal) * BM;
  const int head = blockIdx.y, batch = blockIdx.z;
  const int64_t bh = static_cast<int64_t>(batch) * p.heads + head;
  const T* q = static_cast<const T*>(p.q) + bh * p.q_len * D;
  const T* k = static_cast<const T*>(p.k) + bh * p.k_len * D;
  const T* v = static_cast<const T*>(p.v) + bh * p.k_len * D;
  const float scale_log2 = static_cast<float>(p.scale) * kLog2e;

  int n_blocks = (p.k_len + BN - 1) / BN;
  if (p.causal) n_blocks = min(n_blocks, (min(m0 + BM, p.q_len) - 1) / BN + 1);

  // Group 0: Q (on its way while the mask is read) and the first shown key block's K and V.
  copy_tile_async<BM, D, kThreads>(sQ, kStride, q, m0, p.q_len, tid);
  constexpr int kFlags = Config::kTileBytes;
  const uint8_t* mask = p.key_padding_mask ? p.key_padding_mask + static_cast<int64_t>(batch) * p.k_len : nullptr;
  read_mask_blocks<BN, kFlags>(mask, n_blocks, p.k_len, tid);
  int j = next_shown_block<kFlags>(mask, n_blocks, 0);
  if (j < n_blocks) {
    copy_tile_async<BN, D, kThreads>(sK(0), kStride, k, j * BN, p.k_len, tid);
    copy_tile_async<BN, D, kThreads>(sV(0), kStride, v, j * BN, p.k_len, tid);
  }
  cp_async_commit();

  float o[RT][D / 8][4];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) o[rt][dt][0] = o[rt][dt][1] = o[rt][dt][2] = o[rt][dt][3] = 0.f;
  }
  // Per row tile rt and half r (row g or g + 8): the running max (raw score)
  // and this thread's share of the running sum.
  float row_max[RT][2], row_sum[RT][2];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) row_max[rt][0] = row_max[rt][1] = -INFINITY, row_sum[rt][0] = row_sum[rt][1] = 0.f;
  const int row0 = m0 + warp * 16 * RT + g;  // row of tile rt, half r: row0 + 16 rt + 8 r

  int buffer = 0;
  while (j < n_blocks) {
    const int n0 = j * BN;
    const bool edge = edge_block<BN, kFlags>(mask, j, p.k_len, m0, p.causal);
    // The next shown block's K and V into the other buffer, while this one is
    // used. (Issued after the barrier, which would save the one at the end of
    // the block, the copies spill 8 bytes at head dim 64.)
    const int j_next = next_shown_block<kFlags>(mask, n_blocks, j + 1);
    if (j_next < n_blocks) {
      copy_tile_async<BN, D, kThreads>(sK(buffer ^ 1), kStride, k, j_next * BN, p.k_len, tid);
      copy_tile_async<BN, D, kThreads>(sV(buffer ^ 1), kStride, v, j_next * BN, p.k_len, tid);
      cp_async_commit();
      cp_async_wait<1>();  // this block's group has landed
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* Kb = sK(buffer);
    const T* Vb = sV(buffer);

    // S = Q K^T: each K fragment serves both row tiles.
    float s[RT][BN / 8][4];
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) s[rt][nt][0] = s[rt][nt][1] = s[rt][nt][2] = s[rt][nt][3] = 0.f;
    }
    // At head dim 128 not unrolled: ptxas would fetch every step's Q
    // fragments at once (64 registers) next to O's 128 accumulators.
#pragma unroll kUnrollQ
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t q_frag[RT][4];
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) load_a(q_frag[rt], sQ, kStride, (warp * RT + rt) * 16, kk * 16, lane);
#pragma unroll
      for (int nt = 0; nt < BN / 8; nt += 2) {
        uint32_t b[2][2];
        load_b_rows(b, Kb, kStride, nt * 8, kk * 16, lane);
#pragma unroll
        for (int rt = 0; rt < RT; ++rt) {
          mma_16816<T>(s[rt][nt], q_frag[rt], b[0]);
          mma_16816<T>(s[rt][nt + 1], q_frag[rt], b[1]);
        }
      }
    }

    if (edge) {
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = row0 + 16 * rt + (e >> 1) * 8;
            const int col = n0 + nt * 8 + 2 * t + (e & 1);
            const bool hidden = col >= p.k_len || (p.causal && col > row) || (mask != nullptr && mask[col] != 0);
            if (hidden) s[rt][nt][e] = -INFINITY;
          }
        }
      }
    }

    // The online softmax, on raw scores: p = exp2(s * c - max * c), c = scale log2 e.
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float block_max = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) block_max = fmaxf(block_max, fmaxf(s[rt][nt][2 * r], s[rt][nt][2 * r + 1]));
        const float new_max = fmaxf(row_max[rt][r], quad_max(block_max));
        // A row with no visible key so far keeps max -inf: shift by 0, so that
        // ex2 gives exactly 0 instead of NaN from (-inf) - (-inf).
        const float shift = new_max == -INFINITY ? 0.f : new_max * scale_log2;
        const float rescale = ptx::ex2_approx(fmaf(row_max[rt][r], scale_log2, -shift));
        float block_sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
          s[rt][nt][2 * r] = ptx::ex2_approx(fmaf(s[rt][nt][2 * r], scale_log2, -shift));
          s[rt][nt][2 * r + 1] = ptx::ex2_approx(fmaf(s[rt][nt][2 * r + 1], scale_log2, -shift));
          block_sum += s[rt][nt][2 * r] + s[rt][nt][2 * r + 1];
        }
        row_sum[rt][r] = row_sum[rt][r] * rescale + block_sum;
        row_max[rt][r] = new_max;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
          o[rt][dt][2 * r] *= rescale;
          o[rt][dt][2 * r + 1] *= rescale;
        }
      }
    }

    // O += P V: each V fragment serves both row tiles.
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t p_frag[RT][4];
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) accumulators_to_a<T>(p_frag[rt], s[rt][2 * kk], s[rt][2 * kk + 1]);
#pragma unroll
      for (int dt = 0; dt < D / 8; dt += 2) {
        uint32_t b[2][2];
        load_b_cols(b, Vb, kStride, kk * 16, dt * 8, lane);
#pragma unroll
        for (int rt = 0; rt < RT; ++rt) {
          mma_16816<T>(o[rt][dt], p_frag[rt], b[0]);
          mma_16816<T>(o[rt][dt + 1], p_frag[rt], b[1]);
        }
      }
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
    buffer ^= 1;
    j = j_next;
  }
  cp_async_wait<0>();  // Q's group when the mask hides every key

  T* out = static_cast<T*>(p.out) + bh * p.q_len * D;
  float* lse = static_cast<float*>(p.lse) + bh * p.q_len;
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + 16 * rt + 8 * r;
      const float total = quad_sum(row_sum[rt][r]);
      // total == 0 exactly when every key of the row is hidden: output 0, lse 0.
      const float inv = total > 0.f ? 1.f / total : 0.f;
      if (row < p.q_len) {
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
          *reinterpret_cast<uint32_t*>(out + static_cast<int64_t>(row) * D + dt * 8 + 2 * t) =
              pack2<T>(o[rt][dt][2 * r] * inv, o[rt][dt][2 * r + 1] * inv);
        }
        if (t == 0) lse[row] = total > 0.f ? row_max[rt][r] * static_cast<float>(p.scale) + logf(total) : 0.f;
      }
    }
  }
}

}  // namespace conveyor::attention::cuda
