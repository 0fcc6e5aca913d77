#pragma once
// Tensor-core attention forward, FlashAttention-2 style. One CTA computes
// kBlockM query rows of one (batch, head), kWarps warps of 16 rows each; it
// walks the keys kBlockN at a time, keeping the running row max m, the running
// sum l and the output accumulator O in registers:
//   S = Q K_j^T (mma, float)  ->  mask, scale  ->  m' = max(m, rowmax S)
//   P = exp2(S - m'),  l = l * exp2(m - m') + rowsum P,  O = O * exp2(m - m') + P V_j
// P goes from the S accumulators straight into A fragments (see warp_mma.cuh),
// so the score matrix exists only in registers, a tile at a time. Scores are
// kept in log2 units (scaled by scale * log2 e) so that exp2 can be used.
//
// K_{j+1} is fetched with cp.async while P and P V_j are computed; V_j while
// S is computed. Key blocks whose keys the padding mask hides all are
// skipped (not even fetched), and only the blocks on an edge (the sequence's
// end, the causal diagonal, a partly padded block) test each score.

#include "ops/fused_attention/cuda/attention_kernels.h"
#include "ops/fused_attention/cuda/warp_mma.cuh"

#include <cmath>

namespace conveyor::attention::cuda {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <typename T, int kHeadDim_, int kBlockN_, int kWarps_>
struct FlashForwardConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockM = 16 * kWarps;
  static constexpr int kBlockN = kBlockN_;
  // +8 elements (16 bytes) per row: rows stay 16-byte aligned for cp.async and
  // ldmatrix, and the 8 rows an ldmatrix phase reads fall in distinct banks.
  static constexpr int kStride = kHeadDim + 8;
  static constexpr int kTileBytes = (kBlockM + 2 * kBlockN) * kStride * static_cast<int>(sizeof(T));  // then the mask's block flags
  static_assert(kHeadDim % 16 == 0 && kBlockN % 16 == 0, "tiles are made of 16x16 mma blocks");
};

// The configuration the launcher uses: 4 warps x 16 query rows, 64 keys per
// step; ~130 (d = 64) / ~170 (d = 128) registers a thread, 27 / 52 KB of
// shared memory.
template <typename T, int kHeadDim>
using FlashForwardConfigFor = FlashForwardConfig<T, kHeadDim, /*kBlockN=*/64, /*kWarps=*/4>;

// What the padding mask shows of each key block, as flags in the CTA's
// dynamic shared memory at byte kFlags, one a key block (forward_smem_bytes):
// bit 0 some key, bit 1 every key (a block past the sequence's end shows its
// missing keys as hidden). Read once a CTA, a block per thread with 16-byte
// loads, so that finding the next shown block and telling an edge block take
// no barrier. Free functions of compile-time offsets: a struct of pointers
// kept across the key loop, or a fallback that asks the block with a
// barrier, cost the tiles128 forward 68-76 bytes of spills.
__device__ __forceinline__ bool has_zero_byte(uint32_t v) { return ((v - 0x01010101u) & ~v & 0x80808080u) != 0; }

template <int kFlags>
__device__ __forceinline__ uint8_t* mask_flags() {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  return smem_raw + kFlags;
}

// Fills the flags, then __syncthreads(); every thread calls it.
template <int kBlockN, int kFlags>
__device__ __forceinline__ void read_mask_blocks(const uint8_t* mask, int n_blocks, int k_len, int tid) {
  if (mask == nullptr) return;
  for (int j = tid; j < n_blocks; j += blockDim.x) {
    const int n0 = j * kBlockN, n = min(kBlockN, k_len - n0);
    bool any = false, all = n == kBlockN;
    const uint8_t* m = mask + n0;
    if (n == kBlockN && reinterpret_cast<uintptr_t>(m) % 16 == 0) {
      for (int i = 0; i < kBlockN; i += 16) {
        const uint4 w = *reinterpret_cast<const uint4*>(m + i);
        any = any || has_zero_byte(w.x) || has_zero_byte(w.y) || has_zero_byte(w.z) || has_zero_byte(w.w);
        all = all && (w.x | w.y | w.z | w.w) == 0;
      }
    } else {
      for (int i = 0; i < n; ++i) {
        any = any || m[i] == 0;
        all = all && m[i] == 0;
      }
    }
    mask_flags<kFlags>()[j] = static_cast<uint8_t>((any ? 1 : 0) | (all ? 2 : 0));
  }
  __syncthreads();
}

// The first key block from j on with a key the mask shows (n_blocks if none).
template <int kFlags>
__device__ __forceinline__ int next_shown_block(const uint8_t* mask, int n_blocks, int j) {
  if (mask == nullptr) return j;
  while (j < n_blocks && (mask_flags<kFlags>()[j] & 1) == 0) ++j;
  return j;
}

// Whether key block j must test each score: past the sequence's end, over
// the causal diagonal (the CTA's first query row m0), or a key the mask hides.
template <int kBlockN, int kFlags>
__device__ __forceinline__ bool edge_block(const uint8_t* mask, int j, int k_len, int m0, bool causal) {
  const int n0 = j * kBlockN;
  return n0 + kBlockN > k_len || (causal && n0 + kBlockN - 1 > m0) ||
         (mask != nullptr && (mask_flags<kFlags>()[j] & 2) == 0);
}

// A forward kernel's dynamic shared memory for keys of length k_len: its
// tiles, then the flags.
template <typename Config>
__host__ __device__ constexpr size_t forward_smem_bytes(int k_len) {
  return static_cast<size_t>(Config::kTileBytes) + (static_cast<size_t>(k_len) / Config::kBlockN + 16) / 16 * 16;
}

template <typename T, typename Config>
__global__ void __launch_bounds__(Config::kThreads) flash_forward_kernel(const ForwardParams p) {
  constexpr int D = Config::kHeadDim, BM = Config::kBlockM, BN = Config::kBlockN, kStride = Config::kStride;
  constexpr int kThreads = Config::kThreads;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + BM * kStride;
  T* sV = sK + BN * kStride;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.x * BM;
  const int head = blockIdx.y, batch = blockIdx.z;
  const int64_t bh = static_cast<int64_t>(batch) * p.heads + head;
  const T* q = static_cast<const T*>(p.q) + bh * p.q_len * D;
  const T* k = static_cast<const T*>(p.k) + bh * p.k_len * D;
  const T* v = static_cast<const T*>(p.v) + bh * p.k_len * D;
  const float scale_log2 = static_cast<float>(p.scale) * kLog2e;

  // Key blocks this query block needs: with causal masking, none past its last row.
  int n_blocks = (p.k_len + BN - 1) / BN;
  if (p.causal) n_blocks = min(n_blocks, (min(m0 + BM, p.q_len) - 1) / BN + 1);

  copy_tile_async<BM, D, kThreads>(sQ, kStride, q, m0, p.q_len, tid);
  cp_async_commit();
  constexpr int kFlags = Config::kTileBytes;
  const uint8_t* mask = p.key_padding_mask ? p.key_padding_mask + static_cast<int64_t>(batch) * p.k_len : nullptr;
  read_mask_blocks<BN, kFlags>(mask, n_blocks, p.k_len, tid);
  int j = next_shown_block<kFlags>(mask, n_blocks, 0);
  if (j < n_blocks) copy_tile_async<BN, D, kThreads>(sK, kStride, k, j * BN, p.k_len, tid);
  cp_async_commit();
  cp_async_wait<1>();  // Q has landed
  __syncthreads();

  uint32_t q_frag[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) load_a(q_frag[kk], sQ, kStride, warp * 16, kk * 16, lane);

  float o[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};          // this thread's share; the quad's shares are added at the end
  const int row_lo = m0 + warp * 16 + g;  // rows of registers 0,1; registers 2,3 hold row_lo + 8

  while (j < n_blocks) {
    const int n0 = j * BN;
    const bool edge = edge_block<BN, kFlags>(mask, j, p.k_len, m0, p.causal);  // scores to test one by one
    copy_tile_async<BN, D, kThreads>(sV, kStride, v, n0, p.k_len, tid);
    cp_async_commit();
    cp_async_wait<1>();  // K_j has landed
    __syncthreads();

    float s[BN / 8][4];
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int nt = 0; nt < BN / 8; nt += 2) {
        uint32_t b[2][2];
        load_b_rows(b, sK, kStride, nt * 8, kk * 16, lane);
        mma_16816<T>(s[nt], q_frag[kk], b[0]);
        mma_16816<T>(s[nt + 1], q_frag[kk], b[1]);
      }
    }
    __syncthreads();  // every warp is done with sK
    const int j_next = next_shown_block<kFlags>(mask, n_blocks, j + 1);
    const bool prefetch = j_next < n_blocks;
    if (prefetch) {
      copy_tile_async<BN, D, kThreads>(sK, kStride, k, j_next * BN, p.k_len, tid);
      cp_async_commit();
    }

    // Mask, scale, and the online softmax update of rows row_lo (r = 0) and row_lo + 8 (r = 1).
    if (edge) {
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = row_lo + (e >> 1) * 8;
          const int col = n0 + nt * 8 + 2 * t + (e & 1);
          const bool hidden = col >= p.k_len || (p.causal && col > row) || (mask != nullptr && mask[col] != 0);
          s[nt][e] = hidden ? -INFINITY : s[nt][e] * scale_log2;
        }
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] *= scale_log2;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float block_max = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) block_max = fmaxf(block_max, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      const float new_max = fmaxf(row_max[r], quad_max(block_max));
      // A row with no visible key so far keeps max -inf; shift by 0 so that
      // exp2 gives exactly 0 instead of NaN from (-inf) - (-inf).
      const float shift = new_max == -INFINITY ? 0.f : new_max;
      const float rescale = exp2f(row_max[r] - shift);
      float block_sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
        s[nt][2 * r] = exp2f(s[nt][2 * r] - shift);
        s[nt][2 * r + 1] = exp2f(s[nt][2 * r + 1] - shift);
        block_sum += s[nt][2 * r] + s[nt][2 * r + 1];
      }
      row_sum[r] = row_sum[r] * rescale + block_sum;
      row_max[r] = new_max;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        o[dt][2 * r] *= rescale;
        o[dt][2 * r + 1] *= rescale;
      }
    }

    if (prefetch) {
      cp_async_wait<1>();  // V_j has landed; K_{j+1} may still be in flight
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t p_frag[4];
      accumulators_to_a<T>(p_frag, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int dt = 0; dt < D / 8; dt += 2) {
        uint32_t b[2][2];
        load_b_cols(b, sV, kStride, kk * 16, dt * 8, lane);
        mma_16816<T>(o[dt], p_frag, b[0]);
        mma_16816<T>(o[dt + 1], p_frag, b[1]);
      }
    }
    __syncthreads();  // every warp is done with sV before the next V_j is fetched
    j = j_next;
  }
  cp_async_wait<0>();  // the K block group is empty when the mask hides every key

  T* out = static_cast<T*>(p.out) + bh * p.q_len * D;
  float* lse = static_cast<float*>(p.lse) + bh * p.q_len;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_lo + r * 8;
    const float total = quad_sum(row_sum[r]);
    // total == 0 exactly when every key of the row is hidden: output 0, lse 0.
    const float inv = total > 0.f ? 1.f / total : 0.f;
    if (row < p.q_len) {
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        *reinterpret_cast<uint32_t*>(out + static_cast<int64_t>(row) * D + dt * 8 + 2 * t) =
            pack2<T>(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
      }
      if (t == 0) lse[row] = total > 0.f ? row_max[r] * kLn2 + logf(total) : 0.f;
    }
  }
}

}  // namespace conveyor::attention::cuda
