#pragma once
// The general CUDA path: any head_dim and any dtype (float16, bfloat16,
// float32, float64), with arithmetic in Acc (float, or double for double).
// Same tiling and online softmax as the tensor-core kernels, but with plain
// scalar loops over tiles held in shared memory in Acc, so it is short and
// obviously right rather than fast. The backward runs two kernels, one over
// key blocks (dK, dV) and one over query blocks (dQ), each recomputing the
// probabilities from the saved log-sum-exp; no atomics, deterministic.

#include "ops/fused_attention/cuda/attention_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace conveyor::attention::cuda {

struct SimpleTiles {
  static constexpr int kThreads = 128;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kBlockM = 16;  // query rows per tile
  static constexpr int kBlockN = 32;  // keys per tile: one per lane in the softmax step
  // Shared memory, in Acc elements, of each kernel for head dimension d.
  static constexpr int64_t forward_elements(int64_t d) {
    return (2 * kBlockM + 2 * kBlockN) * d + kBlockM * kBlockN + 3 * kBlockM;
  }
  static constexpr int64_t dkdv_elements(int64_t d) {
    return (4 * kBlockN + 2 * kBlockM) * d + 2 * kBlockM * kBlockN + 2 * kBlockM;
  }
  static constexpr int64_t dq_elements(int64_t d) {
    return (3 * kBlockM + 2 * kBlockN) * d + kBlockM * kBlockN + 2 * kBlockM;
  }
};

template <typename Acc>
__device__ __forceinline__ Acc to_acc(__half x) {
  return static_cast<Acc>(__half2float(x));
}
template <typename Acc>
__device__ __forceinline__ Acc to_acc(__nv_bfloat16 x) {
  return static_cast<Acc>(__bfloat162float(x));
}
template <typename Acc>
__device__ __forceinline__ Acc to_acc(float x) {
  return static_cast<Acc>(x);
}
template <typename Acc>
__device__ __forceinline__ Acc to_acc(double x) {
  return static_cast<Acc>(x);
}

template <typename T>
__device__ __forceinline__ T from_acc(float x) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(x);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else {
    return static_cast<T>(x);
  }
}
template <typename T>
__device__ __forceinline__ T from_acc(double x) {
  return static_cast<T>(x);
}

__device__ __forceinline__ float acc_exp(float x) { return expf(x); }
__device__ __forceinline__ double acc_exp(double x) { return exp(x); }
__device__ __forceinline__ float acc_log(float x) { return logf(x); }
__device__ __forceinline__ double acc_log(double x) { return log(x); }

template <typename Acc>
__device__ __forceinline__ Acc warp_max(Acc v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

template <typename Acc>
__device__ __forceinline__ Acc warp_sum(Acc v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// rows [row0, row0 + kRows) of a [rows, d] matrix into a dense [kRows, d] tile; zeros past `rows`.
template <int kRows, typename T, typename Acc>
__device__ __forceinline__ void load_rows(Acc* tile, const T* global, int row0, int rows, int d, int tid) {
  for (int i = tid; i < kRows * d; i += SimpleTiles::kThreads) {
    const int r = i / d;
    tile[i] = row0 + r < rows ? to_acc<Acc>(global[static_cast<int64_t>(row0) * d + i]) : Acc(0);
  }
}

__device__ __forceinline__ bool key_hidden(const ForwardParams& p, const uint8_t* mask, int query, int key) {
  return key >= p.k_len || query >= p.q_len || (p.causal && key > query) || (mask != nullptr && mask[key] != 0);
}

__device__ __forceinline__ int key_blocks_for(const ForwardParams& p, int m0, int block_m, int block_n) {
  const int all = (p.k_len + block_n - 1) / block_n;
  return p.causal ? min(all, (min(m0 + block_m, p.q_len) - 1) / block_n + 1) : all;
}

template <typename Acc>
__device__ __forceinline__ Acc dot_rows(const Acc* a, const Acc* b, int d) {
  Acc sum = 0;
  for (int i = 0; i < d; ++i) sum += a[i] * b[i];
  return sum;
}

template <typename T, typename Acc>
__global__ void __launch_bounds__(SimpleTiles::kThreads) simple_forward_kernel(const ForwardParams p) {
  constexpr int BM = SimpleTiles::kBlockM, BN = SimpleTiles::kBlockN, kThreads = SimpleTiles::kThreads;
  const int D = p.head_dim;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Acc* sQ = reinterpret_cast<Acc*>(smem_raw);
  Acc* sK = sQ + BM * D;
  Acc* sV = sK + BN * D;
  Acc* sO = sV + BN * D;
  Acc* sS = sO + BM * D;
  Acc* sMax = sS + BM * BN;
  Acc* sSum = sMax + BM;
  Acc* sRescale = sSum + BM;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int m0 = blockIdx.x * BM, head = blockIdx.y, batch = blockIdx.z;
  const int64_t bh = static_cast<int64_t>(batch) * p.heads + head;
  const T* q = static_cast<const T*>(p.q) + bh * p.q_len * D;
  const T* k = static_cast<const T*>(p.k) + bh * p.k_len * D;
  const T* v = static_cast<const T*>(p.v) + bh * p.k_len * D;
  const uint8_t* mask = p.key_padding_mask ? p.key_padding_mask + static_cast<int64_t>(batch) * p.k_len : nullptr;
  const Acc scale = static_cast<Acc>(p.scale);
  const Acc neg_inf = -INFINITY;

  load_rows<BM>(sQ, q, m0, p.q_len, D, tid);
  for (int i = tid; i < BM * D; i += kThreads) sO[i] = 0;
  for (int i = tid; i < BM; i += kThreads) {
    sMax[i] = neg_inf;
    sSum[i] = 0;
  }
  const int n_blocks = key_blocks_for(p, m0, BM, BN);
  for (int j = 0; j < n_blocks; ++j) {
    const int n0 = j * BN;
    __syncthreads();  // the previous tile's readers are done
    load_rows<BN>(sK, k, n0, p.k_len, D, tid);
    load_rows<BN>(sV, v, n0, p.k_len, D, tid);
    __syncthreads();
    for (int i = tid; i < BM * BN; i += kThreads) {
      const int r = i / BN, c = i % BN;
      sS[i] = key_hidden(p, mask, m0 + r, n0 + c) ? neg_inf : dot_rows(sQ + r * D, sK + c * D, D) * scale;
    }
    __syncthreads();
    for (int r = warp; r < BM; r += SimpleTiles::kWarps) {  // lane = key column
      const Acc s = sS[r * BN + lane];
      const Acc old_max = sMax[r];
      const Acc new_max = fmax(old_max, warp_max(s));
      const Acc shift = new_max == neg_inf ? Acc(0) : new_max;  // a row with nothing visible stays at 0
      const Acc e = acc_exp(s - shift);
      const Acc block_sum = warp_sum(e);
      // Every lane has read sMax[r] before lane 0 overwrites it. The shuffles
      // above already order this on the hardware; the barrier says so, and
      // compute-sanitizer's racecheck, which does not model shuffles, reported
      // the pair as a shared-memory hazard on an H200.
      __syncwarp();
      sS[r * BN + lane] = e;
      if (lane == 0) {
        const Acc rescale = acc_exp(old_max - shift);
        sRescale[r] = rescale;
        sSum[r] = sSum[r] * rescale + block_sum;
        sMax[r] = new_max;
      }
    }
    __syncthreads();
    for (int i = tid; i < BM * D; i += kThreads) {
      const int r = i / D, d = i % D;
      Acc acc = sO[i] * sRescale[r];
      for (int c = 0; c < BN; ++c) acc += sS[r * BN + c] * sV[c * D + d];
      sO[i] = acc;
    }
  }
  __syncthreads();
  T* out = static_cast<T*>(p.out) + bh * p.q_len * D;
  Acc* lse = static_cast<Acc*>(p.lse) + bh * p.q_len;
  for (int i = tid; i < BM * D; i += kThreads) {
    const int r = i / D;
    if (m0 + r < p.q_len) out[static_cast<int64_t>(m0) * D + i] = from_acc<T>(sSum[r] > 0 ? sO[i] / sSum[r] : Acc(0));
  }
  for (int r = tid; r < BM; r += kThreads) {
    if (m0 + r < p.q_len) lse[m0 + r] = sSum[r] > 0 ? sMax[r] + acc_log(sSum[r]) : Acc(0);
  }
}

// P and dS of a [BM, BN] tile from the rows in shared memory.
template <typename Acc>
__device__ __forceinline__ void probabilities_and_score_grads(const ForwardParams& p, const uint8_t* mask, int m0,
                                                              int n0, const Acc* sQ, const Acc* sK, const Acc* sdO,
                                                              const Acc* sV, const Acc* sLse, const Acc* sDot, Acc* sP,
                                                              Acc* sdS, int tid) {
  constexpr int BM = SimpleTiles::kBlockM, BN = SimpleTiles::kBlockN;
  const int D = p.head_dim;
  const Acc scale = static_cast<Acc>(p.scale);
  for (int i = tid; i < BM * BN; i += SimpleTiles::kThreads) {
    const int r = i / BN, c = i % BN;
    Acc prob = 0, ds = 0;
    if (!key_hidden(p, mask, m0 + r, n0 + c)) {
      prob = acc_exp(dot_rows(sQ + r * D, sK + c * D, D) * scale - sLse[r]);
      ds = prob * (dot_rows(sdO + r * D, sV + c * D, D) - sDot[r]);
    }
    if (sP != nullptr) sP[i] = prob;
    sdS[i] = ds;
  }
}

template <typename Acc>
__device__ __forceinline__ void load_row_stats(Acc* sLse, Acc* sDot, const Acc* lse, const Acc* row_dot, int m0,
                                               int q_len, int tid) {
  for (int i = tid; i < SimpleTiles::kBlockM; i += SimpleTiles::kThreads) {
    const bool valid = m0 + i < q_len;
    sLse[i] = valid ? lse[m0 + i] : Acc(0);
    sDot[i] = valid ? row_dot[m0 + i] : Acc(0);
  }
}

template <typename T, typename Acc>
__global__ void __launch_bounds__(SimpleTiles::kThreads) simple_dkdv_kernel(const BackwardParams bp) {
  constexpr int BM = SimpleTiles::kBlockM, BN = SimpleTiles::kBlockN, kThreads = SimpleTiles::kThreads;
  const ForwardParams& p = bp.fwd;
  const int D = p.head_dim;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Acc* sK = reinterpret_cast<Acc*>(smem_raw);
  Acc* sV = sK + BN * D;
  Acc* sdK = sV + BN * D;
  Acc* sdV = sdK + BN * D;
  Acc* sQ = sdV + BN * D;
  Acc* sdO = sQ + BM * D;
  Acc* sP = sdO + BM * D;
  Acc* sdS = sP + BM * BN;
  Acc* sLse = sdS + BM * BN;
  Acc* sDot = sLse + BM;

  const int tid = threadIdx.x;
  const int n0 = blockIdx.x * BN, head = blockIdx.y, batch = blockIdx.z;
  const int64_t bh = static_cast<int64_t>(batch) * p.heads + head;
  const uint8_t* mask = p.key_padding_mask ? p.key_padding_mask + static_cast<int64_t>(batch) * p.k_len : nullptr;
  load_rows<BN>(sK, static_cast<const T*>(p.k) + bh * p.k_len * D, n0, p.k_len, D, tid);
  load_rows<BN>(sV, static_cast<const T*>(p.v) + bh * p.k_len * D, n0, p.k_len, D, tid);
  for (int i = tid; i < BN * D; i += kThreads) sdK[i] = sdV[i] = 0;

  const int m_first = p.causal ? (n0 / BM) * BM : 0;  // earlier queries see none of these keys
  for (int m0 = m_first; m0 < p.q_len; m0 += BM) {
    __syncthreads();
    load_rows<BM>(sQ, static_cast<const T*>(p.q) + bh * p.q_len * D, m0, p.q_len, D, tid);
    load_rows<BM>(sdO, static_cast<const T*>(bp.grad_out) + bh * p.q_len * D, m0, p.q_len, D, tid);
    load_row_stats(sLse, sDot, static_cast<const Acc*>(p.lse) + bh * p.q_len,
                   static_cast<const Acc*>(bp.row_dot) + bh * p.q_len, m0, p.q_len, tid);
    __syncthreads();
    probabilities_and_score_grads(p, mask, m0, n0, sQ, sK, sdO, sV, sLse, sDot, sP, sdS, tid);
    __syncthreads();
    for (int i = tid; i < BN * D; i += kThreads) {
      const int c = i / D, d = i % D;
      Acc dv = 0, dk = 0;
      for (int r = 0; r < BM; ++r) {
        dv += sP[r * BN + c] * sdO[r * D + d];
        dk += sdS[r * BN + c] * sQ[r * D + d];
      }
      sdV[i] += dv;
      sdK[i] += dk;
    }
  }
  __syncthreads();
  T* grad_k = static_cast<T*>(bp.grad_k) + bh * p.k_len * D;
  T* grad_v = static_cast<T*>(bp.grad_v) + bh * p.k_len * D;
  const Acc scale = static_cast<Acc>(p.scale);
  for (int i = tid; i < BN * D; i += kThreads) {
    if (n0 + i / D < p.k_len) {
      grad_k[static_cast<int64_t>(n0) * D + i] = from_acc<T>(sdK[i] * scale);
      grad_v[static_cast<int64_t>(n0) * D + i] = from_acc<T>(sdV[i]);
    }
  }
}

template <typename T, typename Acc>
__global__ void __launch_bounds__(SimpleTiles::kThreads) simple_dq_kernel(const BackwardParams bp) {
  constexpr int BM = SimpleTiles::kBlockM, BN = SimpleTiles::kBlockN, kThreads = SimpleTiles::kThreads;
  const ForwardParams& p = bp.fwd;
  const int D = p.head_dim;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Acc* sQ = reinterpret_cast<Acc*>(smem_raw);
  Acc* sdO = sQ + BM * D;
  Acc* sdQ = sdO + BM * D;
  Acc* sK = sdQ + BM * D;
  Acc* sV = sK + BN * D;
  Acc* sdS = sV + BN * D;
  Acc* sLse = sdS + BM * BN;
  Acc* sDot = sLse + BM;

  const int tid = threadIdx.x;
  const int m0 = blockIdx.x * BM, head = blockIdx.y, batch = blockIdx.z;
  const int64_t bh = static_cast<int64_t>(batch) * p.heads + head;
  const uint8_t* mask = p.key_padding_mask ? p.key_padding_mask + static_cast<int64_t>(batch) * p.k_len : nullptr;
  load_rows<BM>(sQ, static_cast<const T*>(p.q) + bh * p.q_len * D, m0, p.q_len, D, tid);
  load_rows<BM>(sdO, static_cast<const T*>(bp.grad_out) + bh * p.q_len * D, m0, p.q_len, D, tid);
  load_row_stats(sLse, sDot, static_cast<const Acc*>(p.lse) + bh * p.q_len,
                 static_cast<const Acc*>(bp.row_dot) + bh * p.q_len, m0, p.q_len, tid);
  for (int i = tid; i < BM * D; i += kThreads) sdQ[i] = 0;

  const int n_blocks = key_blocks_for(p, m0, BM, BN);
  for (int j = 0; j < n_blocks; ++j) {
    const int n0 = j * BN;
    __syncthreads();
    load_rows<BN>(sK, static_cast<const T*>(p.k) + bh * p.k_len * D, n0, p.k_len, D, tid);
    load_rows<BN>(sV, static_cast<const T*>(p.v) + bh * p.k_len * D, n0, p.k_len, D, tid);
    __syncthreads();
    probabilities_and_score_grads<Acc>(p, mask, m0, n0, sQ, sK, sdO, sV, sLse, sDot, nullptr, sdS, tid);
    __syncthreads();
    for (int i = tid; i < BM * D; i += kThreads) {
      const int r = i / D, d = i % D;
      Acc dq = 0;
      for (int c = 0; c < BN; ++c) dq += sdS[r * BN + c] * sK[c * D + d];
      sdQ[i] += dq;
    }
  }
  __syncthreads();
  T* grad_q = static_cast<T*>(bp.grad_q) + bh * p.q_len * D;
  const Acc scale = static_cast<Acc>(p.scale);
  for (int i = tid; i < BM * D; i += kThreads) {
    if (m0 + i / D < p.q_len) grad_q[static_cast<int64_t>(m0) * D + i] = from_acc<T>(sdQ[i] * scale);
  }
}

// rowsum(grad_out * out) per query row: one warp per row.
template <typename T, typename Acc>
__global__ void __launch_bounds__(SimpleTiles::kThreads) row_dot_kernel(const BackwardParams bp) {
  const ForwardParams& p = bp.fwd;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.heads * p.q_len;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * SimpleTiles::kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // whole warps leave together
  const T* dout = static_cast<const T*>(bp.grad_out) + row * p.head_dim;
  const T* out = static_cast<const T*>(p.out) + row * p.head_dim;
  Acc sum = 0;
  for (int d = lane; d < p.head_dim; d += 32) sum += to_acc<Acc>(dout[d]) * to_acc<Acc>(out[d]);
  sum = warp_sum(sum);
  if (lane == 0) static_cast<Acc*>(bp.row_dot)[row] = sum;
}

}  // namespace conveyor::attention::cuda
