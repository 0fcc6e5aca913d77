#pragma once
// Tensor-core attention backward, FlashAttention-2 style. One CTA owns
// kBlockN keys of one (batch, head), 16 per key warp, and keeps their dK and
// dV accumulators in registers while it walks the query rows kBlockM at a
// time. Per query block, in the transposed view (keys as rows) so that each
// warp's results are rows it owns:
//   S^T  = K Q^T                     P^T = exp2(S^T * scale log2 e - lse log2 e)
//   dP^T = V dO^T                    dS^T = P^T * (dP^T - D),  D = rowsum(dO * O)
//   dV  += P^T dO                    dK  += dS^T Q            (scale applied once at the end)
//   dQ  += dS K * scale -> atomicAdd (8 bytes at a time) into a float
//                          workspace shared by all key blocks
// With kSplit = 1 (v1, and tiles128 at head dim 64) a warp owns 16 keys and
// all of their dK and dV columns: P^T and dS^T go from accumulators straight
// into A fragments, and dS is also written to shared memory, transposed, for
// the dQ product, whose rows mix the keys of every warp. With kSplit = 2
// (tiles128 at head dim 128, where 16 keys' dK and dV alone are 128
// accumulators a thread) the two warps of a key row block share its dK and dV
// columns half and half: each computes S^T and dP^T for half of the block's
// queries and writes P^T and dS^T to shared memory (key-major, 4 bytes a
// store), from which both read the whole block for their products, and dQ
// reads dS with transposed loads. The probabilities are recomputed from the
// saved log-sum-exp, never stored; hidden keys (and every key of a fully
// masked row) get probability 0 and so contribute nothing, and a CTA whose
// keys the padding mask hides all skips the queries altogether.

#include "ops/fused_attention/cuda/attention_kernels.h"
#include "ops/fused_attention/cuda/flash_forward_kernel.cuh"
#include "ops/fused_attention/cuda/warp_mma.cuh"

#include <type_traits>

namespace conveyor::attention::cuda {

template <typename T, int kHeadDim_, int kBlockM_, int kWarps_, int kBuffers_ = 1, int kSplit_ = 1,
          bool kTiles_ = false>
struct FlashBackwardConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kSplit = kSplit_;              // warps sharing a key row block's dK and dV columns
  static constexpr int kKeyWarps = kWarps / kSplit;   // key row blocks of 16
  static constexpr int kBlockN = 16 * kKeyWarps;      // keys per CTA
  static constexpr int kBlockM = kBlockM_;            // query rows per step
  static constexpr int kWarpQueries = kBlockM / kSplit;  // of S^T and dP^T, per warp
  static constexpr int kWarpDims = kHeadDim / kSplit;    // of dK and dV, per warp
  static constexpr int kBuffers = kBuffers_;  // 2: the next query block's Q, dO, lse and D fetched during this one
  // tiles128's refinements: each probability one FMA and ex2.approx, as its
  // forward computes the log-sum-exp; masks tested only on edge tiles.
  static constexpr bool kTiles = kTiles_;
  static constexpr int kStride = kHeadDim + 8;
  static constexpr int kDsStride = kBlockN + 8;  // kSplit 1: dS query-major, [kBlockM][kDsStride]
  static constexpr int kPStride = kBlockM + 8;   // kSplit 2: P^T and dS^T key-major, [kBlockN][kPStride] each
  static constexpr int kScoreElements = kSplit == 1 ? kBlockM * kDsStride : 2 * kBlockN * kPStride;
  // Elements of one query buffer: Q and dO tiles.
  static constexpr int kQueryBuffer = 2 * kBlockM * kStride;
  static constexpr int kSmemBytes = (2 * kBlockN * kStride + kBuffers * kQueryBuffer) * static_cast<int>(sizeof(T)) +
                                    kScoreElements * static_cast<int>(sizeof(T)) +
                                    kBuffers * 2 * kBlockM * static_cast<int>(sizeof(float));
  // dQ = dS K: warp w takes 16-row block w % kRowBlocks and kDqTilesPerWarp
  // 8-column tiles, produced kDqChunk tiles at a time so that few
  // accumulators are live next to dK and dV.
  static constexpr int kRowBlocks = kBlockM / 16;
  static constexpr int kDqTilesPerWarp = (kHeadDim / 8) / (kWarps / kRowBlocks);
  static constexpr int kDqChunk = 4;
  static_assert(kHeadDim % 16 == 0 && kBlockM % 16 == 0, "tiles are made of 16x16 mma blocks");
  static_assert(kSplit == 1 || kSplit == 2, "a key row block's columns go to one warp or two");
  static_assert(kWarpQueries % 16 == 0 && kWarpDims % 16 == 0, "each warp's share is whole 16x16 blocks");
  static_assert(kWarps % kRowBlocks == 0, "each warp takes whole dQ row blocks");
  static_assert(kDqTilesPerWarp * (kWarps / kRowBlocks) == kHeadDim / 8, "dQ columns split evenly across warps");
  static_assert(kDqTilesPerWarp % kDqChunk == 0 && kDqChunk % 2 == 0, "dQ chunks are whole tile pairs");
};

// The kernel variant "v1": 64 keys a CTA (4 warps x 16), query steps of 64
// rows at head_dim 64 and of 32 at head_dim 128, where dK and dV already hold
// 128 accumulators a thread.
template <typename T, int kHeadDim>
using FlashBackwardConfigFor = FlashBackwardConfig<T, kHeadDim, /*kBlockM=*/kHeadDim <= 64 ? 64 : 32, /*kWarps=*/4>;
// "tiles128": the query blocks double-buffered (the next one's Q, dO, lse
// and D fetched while this one is used). At head dim 64, 64 keys a CTA (4
// warps x 16; 128 keys, which would serve each query block to twice the
// keys, spilled 24-60 bytes) and query steps of 64. At head dim 128, 64 keys
// a CTA in 8 warps, two to a key row block (kSplit 2: 64 dK and dV
// accumulators a thread, where one warp to a row block held 128 and spilled
// 16 bytes), and query steps of 64.
template <typename T, int kHeadDim>
using TilesBackwardConfigFor =
    FlashBackwardConfig<T, kHeadDim, /*kBlockM=*/64, /*kWarps=*/kHeadDim <= 64 ? 4 : 8, /*kBuffers=*/2,
                        /*kSplit=*/kHeadDim <= 64 ? 1 : 2, /*kTiles=*/true>;

// A fragment of the 16x16 block at (row0, col0) of A = M^T, where M is a
// row-major tile (A's rows are M's columns: dS from key-major dS^T).
template <typename T>
__device__ __forceinline__ void load_a_transposed(uint32_t (&a)[4], const T* tile, int stride, int row0, int col0,
                                                  int lane) {
  const int i = lane >> 3, r = lane & 7;
  ldmatrix_x4_trans(a, tile + (col0 + (i >> 1) * 8 + r) * stride + row0 + (i & 1) * 8);
}

// dQ += (a, b) at dq: one 8-byte atomic where the GPU has them (sm_90).
__device__ __forceinline__ void atomic_add2(float* dq, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dq), make_float2(a, b));
#else
  atomicAdd(dq, a);
  atomicAdd(dq + 1, b);
#endif
}

template <typename T, typename Config>
__global__ void __launch_bounds__(Config::kThreads) flash_backward_kernel(const BackwardParams bp) {
  constexpr int D = Config::kHeadDim, BM = Config::kBlockM, BN = Config::kBlockN;
  constexpr int QW = Config::kWarpQueries, DW = Config::kWarpDims;
  constexpr int kStride = Config::kStride, kDsStride = Config::kDsStride, kPStride = Config::kPStride;
  constexpr int kThreads = Config::kThreads;
  constexpr bool kSplit = Config::kSplit > 1;
  const ForwardParams& p = bp.fwd;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);
  T* sV = sK + BN * kStride;
  T* sQuery = sV + BN * kStride;                                // buffers of Q then dO
  T* sdS = sQuery + Config::kBuffers * Config::kQueryBuffer;    // kSplit 1: [BM][kDsStride], dS query-major
  T* sP = sdS + (kSplit ? BN * kPStride : 0);                   // kSplit 2: sdS [BN][kPStride] is dS^T, then P^T
  float* sStats = reinterpret_cast<float*>(sdS + Config::kScoreElements);  // buffers of lse * log2 e then D

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  // This warp's 16 keys (row block key_warp), its queries of each block
  // [q_first, q_first + QW) for S^T and dP^T, and its dK / dV columns
  // [d_first, d_first + DW).
  const int key_warp = warp % Config::kKeyWarps, part = warp / Config::kKeyWarps;
  const int q_first = part * QW, d_first = part * DW;
  const int n0 = blockIdx.x * BN;
  const int head = blockIdx.y, batch = blockIdx.z;
  const int64_t bh = static_cast<int64_t>(batch) * p.heads + head;
  const T* q = static_cast<const T*>(p.q) + bh * p.q_len * D;
  const T* k = static_cast<const T*>(p.k) + bh * p.k_len * D;
  const T* v = static_cast<const T*>(p.v) + bh * p.k_len * D;
  const T* dout = static_cast<const T*>(bp.grad_out) + bh * p.q_len * D;
  const float* lse = static_cast<const float*>(p.lse) + bh * p.q_len;
  const float* row_dot = static_cast<const float*>(bp.row_dot) + bh * p.q_len;
  float* dq_accum = bp.grad_q_accum + bh * p.q_len * D;
  const uint8_t* mask = p.key_padding_mask ? p.key_padding_mask + static_cast<int64_t>(batch) * p.k_len : nullptr;
  const float scale = static_cast<float>(p.scale);
  const float scale_log2 = scale * kLog2e;
  // Query block m0's Q and dO tiles into buffer b (cp.async, committed by the caller).
  auto fetch_tiles = [&](int m0, int b) {
    T* q_tile = sQuery + b * Config::kQueryBuffer;
    copy_tile_async<BM, D, kThreads>(q_tile, kStride, q, m0, p.q_len, tid);
    copy_tile_async<BM, D, kThreads>(q_tile + BM * kStride, kStride, dout, m0, p.q_len, tid);
  };
  // Query block m0's lse (times log2 e) and D for row tid, 0 past the last
  // query: plain loads into registers, stored to buffer b by store_stats
  // (as 4-byte cp.async copies they cost every configuration 28-76 bytes of
  // spills). The double-buffered kernels load the next block's at the top of
  // a step and store them at its end, so the loads' latency hides behind it.
  static_assert(BM <= kThreads, "a thread a query row of the statistics");
  auto load_stats = [&](int m0) {
    float2 st = make_float2(0.f, 0.f);
    if (tid < BM && m0 + tid < p.q_len) st = make_float2(lse[m0 + tid] * kLog2e, row_dot[m0 + tid]);
    return st;
  };
  auto store_stats = [&](float2 st, int b) {
    if (tid < BM) {
      sStats[b * 2 * BM + tid] = st.x;
      sStats[b * 2 * BM + BM + tid] = st.y;
    }
  };

  copy_tile_async<BN, D, kThreads>(sK, kStride, k, n0, p.k_len, tid);
  copy_tile_async<BN, D, kThreads>(sV, kStride, v, n0, p.k_len, tid);
  cp_async_commit();

  // This lane's keys: rows key_lo (registers 0,1) and key_lo + 8 (registers 2,3).
  const int key_lo = n0 + key_warp * 16 + g;
  bool key_hidden[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key_lo + 8 * r;
    key_hidden[r] = key >= p.k_len || (mask != nullptr && mask[key] != 0);
  }

  float dk[DW / 8][4], dv[DW / 8][4];
#pragma unroll
  for (int dt = 0; dt < DW / 8; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.f;
  }

  // With causal masking, queries before n0 see none of these keys; where
  // the mask hides them all, no query does (dK = dV = 0, nothing for dQ).
  const bool any_shown = __syncthreads_or(!key_hidden[0] || !key_hidden[1]) != 0;
  // tiles128 tests masks only on edge tiles: where a key of this CTA is
  // hidden or on the causal diagonal.
  const bool all_shown = Config::kTiles && __syncthreads_and(!key_hidden[0] && !key_hidden[1]) != 0;
  const int m_first = !any_shown ? p.q_len : p.causal ? (n0 / BM) * BM : 0;
  if (Config::kBuffers == 2 && m_first < p.q_len) {
    fetch_tiles(m_first, 0);
    store_stats(load_stats(m_first), 0);
    cp_async_commit();
  }
  int buffer = 0;
  for (int m0 = m_first; m0 < p.q_len; m0 += BM) {
    const bool next = Config::kBuffers == 2 && m0 + BM < p.q_len;
    float2 next_stats = make_float2(0.f, 0.f);
    if constexpr (Config::kBuffers == 2) {
      // The next query block into the other buffer while this one is used.
      if (next) {
        fetch_tiles(m0 + BM, buffer ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
        next_stats = load_stats(m0 + BM);
      } else {
        cp_async_wait<0>();
      }
    } else {
      fetch_tiles(m0, 0);
      store_stats(load_stats(m0), 0);
      cp_async_commit();
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* sQ = sQuery + buffer * Config::kQueryBuffer;
    const T* sdO = sQ + BM * kStride;
    const float* sLse = sStats + buffer * 2 * BM;
    const float* sDot = sLse + BM;

    // S^T and dP^T for this warp's 16 keys x its QW queries of the block.
    float s[QW / 8][4], dp[QW / 8][4];
#pragma unroll
    for (int nt = 0; nt < QW / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t k_frag[4];
      load_a(k_frag, sK, kStride, key_warp * 16, kk * 16, lane);
#pragma unroll
      for (int nt = 0; nt < QW / 8; nt += 2) {
        uint32_t b[2][2];
        load_b_rows(b, sQ, kStride, q_first + nt * 8, kk * 16, lane);
        mma_16816<T>(s[nt], k_frag, b[0]);
        mma_16816<T>(s[nt + 1], k_frag, b[1]);
      }
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t v_frag[4];
      load_a(v_frag, sV, kStride, key_warp * 16, kk * 16, lane);
#pragma unroll
      for (int nt = 0; nt < QW / 8; nt += 2) {
        uint32_t b[2][2];
        load_b_rows(b, sdO, kStride, q_first + nt * 8, kk * 16, lane);
        mma_16816<T>(dp[nt], v_frag, b[0]);
        mma_16816<T>(dp[nt + 1], v_frag, b[1]);
      }
    }

    // P^T in s, dS^T in dp; dS also to shared memory (kSplit 1: as
    // [query][key]; kSplit 2: P^T and dS^T as [key][query], two queries a store).
    // Rows past the last query need no mask: their Q, dO, lse and D are
    // zeros, so their dS is 0, their dO adds nothing to dV and no dQ row is
    // written for them.
    const bool edge = !Config::kTiles || !all_shown || (p.causal && m0 < n0 + BN - 1);
    auto probabilities = [&](auto masked) {
#pragma unroll
      for (int nt = 0; nt < QW / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1;
          const int ql = q_first + nt * 8 + 2 * t + (e & 1);
          bool hidden = false;
          if constexpr (decltype(masked)::value) {
            const int key = key_lo + 8 * r;
            const int query = m0 + ql;
            hidden = key_hidden[r] || query >= p.q_len || (p.causal && key > query);
          }
          float prob;
          if constexpr (Config::kTiles) {
            prob = hidden ? 0.f : ptx::ex2_approx(fmaf(s[nt][e], scale_log2, -sLse[ql]));
          } else {
            prob = hidden ? 0.f : exp2f(s[nt][e] * scale_log2 - sLse[ql]);
          }
          const float ds = prob * (dp[nt][e] - sDot[ql]);
          s[nt][e] = prob;
          dp[nt][e] = ds;
          if constexpr (!kSplit) {
            if constexpr (MmaType<T>::kIsBFloat16) {
              sdS[ql * kDsStride + key_warp * 16 + g + 8 * r] = __float2bfloat16_rn(ds);
            } else {
              sdS[ql * kDsStride + key_warp * 16 + g + 8 * r] = __float2half_rn(ds);
            }
          }
        }
        if constexpr (kSplit) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int at = (key_warp * 16 + g + 8 * r) * kPStride + q_first + nt * 8 + 2 * t;
            *reinterpret_cast<uint32_t*>(sP + at) = pack2<T>(s[nt][2 * r], s[nt][2 * r + 1]);
            *reinterpret_cast<uint32_t*>(sdS + at) = pack2<T>(dp[nt][2 * r], dp[nt][2 * r + 1]);
          }
        }
      }
    };
    if (edge) {
      probabilities(std::true_type{});
    } else {
      probabilities(std::false_type{});
    }
    if constexpr (kSplit) __syncthreads();  // P^T and dS^T complete: both warps' halves of each row block

    // dV += P^T dO and dK += dS^T Q over this block's BM queries, in this warp's DW columns.
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {
      uint32_t p_frag[4], ds_frag[4];
      if constexpr (kSplit) {
        load_a(p_frag, sP, kPStride, key_warp * 16, kk * 16, lane);
        load_a(ds_frag, sdS, kPStride, key_warp * 16, kk * 16, lane);
      } else {
        accumulators_to_a<T>(p_frag, s[2 * kk], s[2 * kk + 1]);
        accumulators_to_a<T>(ds_frag, dp[2 * kk], dp[2 * kk + 1]);
      }
#pragma unroll
      for (int dt = 0; dt < DW / 8; dt += 2) {
        uint32_t b[2][2];
        load_b_cols(b, sdO, kStride, kk * 16, d_first + dt * 8, lane);
        mma_16816<T>(dv[dt], p_frag, b[0]);
        mma_16816<T>(dv[dt + 1], p_frag, b[1]);
        load_b_cols(b, sQ, kStride, kk * 16, d_first + dt * 8, lane);
        mma_16816<T>(dk[dt], ds_frag, b[0]);
        mma_16816<T>(dk[dt + 1], ds_frag, b[1]);
      }
    }
    if constexpr (!kSplit) __syncthreads();  // sdS complete

    // dQ[m0 : m0 + BM] += dS K (unscaled): warp -> a 16-row block and a share of the columns.
    const int row_block = warp % Config::kRowBlocks;
    const int first_tile = (warp / Config::kRowBlocks) * Config::kDqTilesPerWarp;
#pragma unroll 1
    for (int chunk = 0; chunk < Config::kDqTilesPerWarp; chunk += Config::kDqChunk) {
      float acc[Config::kDqChunk][4];
#pragma unroll
      for (int c = 0; c < Config::kDqChunk; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t a[4];
        if constexpr (kSplit) {
          load_a_transposed(a, sdS, kPStride, row_block * 16, kk * 16, lane);
        } else {
          load_a(a, sdS, kDsStride, row_block * 16, kk * 16, lane);
        }
#pragma unroll
        for (int c = 0; c < Config::kDqChunk; c += 2) {
          uint32_t b[2][2];
          load_b_cols(b, sK, kStride, kk * 16, (first_tile + chunk + c) * 8, lane);
          mma_16816<T>(acc[c], a, b[0]);
          mma_16816<T>(acc[c + 1], a, b[1]);
        }
      }
#pragma unroll
      for (int c = 0; c < Config::kDqChunk; ++c) {
        const int col = (first_tile + chunk + c) * 8 + 2 * t;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int query = m0 + row_block * 16 + g + 8 * r;
          if (query < p.q_len) {
            atomic_add2(dq_accum + static_cast<int64_t>(query) * D + col, acc[c][2 * r] * scale,
                        acc[c][2 * r + 1] * scale);
          }
        }
      }
    }
    if (next) store_stats(next_stats, buffer ^ 1);  // that buffer's last reader was the step before
    __syncthreads();  // sQ, sdO, sP and sdS are refilled next
    buffer ^= Config::kBuffers - 1;
  }
  cp_async_wait<0>();  // K and V were never waited for when no query sees these keys

  T* grad_k = static_cast<T*>(bp.grad_k) + bh * p.k_len * D;
  T* grad_v = static_cast<T*>(bp.grad_v) + bh * p.k_len * D;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key_lo + 8 * r;
    if (key >= p.k_len) continue;
#pragma unroll
    for (int dt = 0; dt < DW / 8; ++dt) {
      const int64_t at = static_cast<int64_t>(key) * D + d_first + dt * 8 + 2 * t;
      *reinterpret_cast<uint32_t*>(grad_k + at) = pack2<T>(dk[dt][2 * r] * scale, dk[dt][2 * r + 1] * scale);
      *reinterpret_cast<uint32_t*>(grad_v + at) = pack2<T>(dv[dt][2 * r], dv[dt][2 * r + 1]);
    }
  }
}

}  // namespace conveyor::attention::cuda
