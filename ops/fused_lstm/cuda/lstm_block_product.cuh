#pragma once
// The recurrent product of the persistent LSTM kernels, one block's share:
//
//   P[m][n] = sum_k A[m][k] * V[n][k]
//
// A is the block's slice of W_hh, resident in shared memory for the whole
// launch (forward: its units' 4U gate rows, k over the H inputs; backward:
// its U columns of W_hh transposed, k over the 4H gates); V is the vector the
// grid shares each step, one row a batch entry (forward: h_{t-1}; backward:
// dgates_{t+1}), staged into shared memory `chunk` values of k at a time. The
// 8 warps split the work into jobs (an output tile, or an output element,
// times a slice of k), and each job adds its sum into its own slot of
// P[k_split][m][n]; the caller adds the k_splits slots, in order, so that the
// result does not depend on timing.
//
// Three ways to multiply, chosen by the launcher (lstm_persistent_kernel.cu):
//   kMma16: float16 / bfloat16 operands on tensor cores, mma.sync m16n8k16
//           with float32 accumulation; A rows on the M side, the batch on N
//           (an n8 tile covers a batch of 8).
//   kTf32:  float32 operands rounded to TF32, mma.sync m16n8k8 (PyTorch's
//           TF32 setting for cuDNN's RNNs allows it).
//   kFma:   scalar fused multiply-adds in the accumulation dtype (float32
//           without TF32, float64, and the measuring variant persistent_fma).
// Rows of A past `rows` read as zeros (a partial last block, or U < 16), and
// both operands are zero past k, so padding never meets a NaN.
#include "ops/cuda/ptx.cuh"
#include "ops/fused_lstm/cuda/lstm_cell_math.cuh"
#include "ops/fused_lstm/cuda/lstm_kernels.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace conveyor::lstm::cuda::block {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__host__ __device__ constexpr int round_up(int x, int to) { return (x + to - 1) / to * to; }
__host__ __device__ constexpr size_t align16(size_t bytes) { return (bytes + 15) / 16 * 16; }

// What the operands are stored as in shared memory.
template <typename scalar_t, Math math>
struct Operands {
  using acc_t = AccOf<scalar_t>;
  // kFma keeps A in the parameter's dtype (half the room for 16-bit types)
  // and V in the accumulation dtype.
  using a_t = std::conditional_t<math == Math::kTf32, float, scalar_t>;
  using v_t = std::conditional_t<math == Math::kMma16, scalar_t, std::conditional_t<math == Math::kTf32, float, acc_t>>;
  static constexpr int kTileM = math == Math::kFma ? 1 : 16;
  static constexpr int kTileN = math == Math::kFma ? 1 : 8;
  static constexpr int kTileK = math == Math::kMma16 ? 16 : (math == Math::kTf32 ? 8 : 1);
  // Row padding, in elements: 16 bytes for the 16-bit tiles (ldmatrix rows
  // land in distinct bank groups), 4 words for TF32 (the fragment loads of a
  // warp hit 32 distinct banks).
  static constexpr int kPad = math == Math::kMma16 ? 8 : (math == Math::kTf32 ? 4 : 0);
};

// Where a block's operands live in its dynamic shared memory, and how the
// work is split. Computed on the host (persistent_layout), passed by value.
struct Layout {
  int rows = 0;       // rows of A this block owns (4U forward, U backward); the last block may own fewer
  int rows_pad = 0;   // rows rounded up to the M tile
  int k = 0;          // reduction length (H forward, 4H backward)
  int k_pad = 0;      // k rounded up to the K tile
  int a_stride = 0;   // elements per row of A
  int batch = 0;
  int n_pad = 0;      // batch rounded up to the N tile
  int chunk = 0;      // values of k staged per pass (a multiple of the K tile)
  int v_stride = 0;   // elements per row of V's chunk
  int k_splits = 0;   // jobs per output tile
  size_t a_offset = 0, v_offset = 0, p_offset = 0, state_offset = 0, zero_offset = 0, bytes = 0;
};

// Fills `l` for a block of `rows` rows over reduction length `k`, with
// `state_bytes` of the caller's own (the cell state) at state_offset. The
// chunk is the largest that fits `limit`; bytes = 0 when even one K tile does not.
template <typename scalar_t, Math math>
Layout layout(int rows, int k, int batch, size_t state_bytes, size_t limit) {
  using Ops = Operands<scalar_t, math>;
  using acc_t = AccOf<scalar_t>;
  Layout l;
  l.rows = rows;
  l.rows_pad = round_up(rows, Ops::kTileM);
  l.k = k;
  l.k_pad = round_up(k, Ops::kTileK);
  l.a_stride = l.k_pad + Ops::kPad;
  l.batch = batch;
  l.n_pad = round_up(batch, Ops::kTileN);
  const int tiles = (l.rows_pad / Ops::kTileM) * (l.n_pad / Ops::kTileN);
  l.k_splits = tiles >= kWarps ? 1 : kWarps / tiles;  // at most one job a warp: none waits for a second
  const size_t a_bytes = align16(static_cast<size_t>(rows) * l.a_stride * sizeof(typename Ops::a_t));
  const size_t p_bytes = align16(static_cast<size_t>(l.k_splits) * l.rows_pad * l.n_pad * sizeof(acc_t));
  const size_t fixed = a_bytes + p_bytes + align16(state_bytes) + 16;
  const size_t per_k = static_cast<size_t>(l.n_pad) * sizeof(typename Ops::v_t);
  const size_t pad_bytes = static_cast<size_t>(l.n_pad) * Ops::kPad * sizeof(typename Ops::v_t);
  if (fixed + pad_bytes + per_k * Ops::kTileK + 16 > limit) return Layout{};  // not even one K tile a pass
  const size_t room = (limit - fixed - pad_bytes - 16) / per_k;
  l.chunk = static_cast<int>(std::min<size_t>(l.k_pad, room / Ops::kTileK * Ops::kTileK));
  l.v_stride = l.chunk + Ops::kPad;
  l.a_offset = 0;
  l.v_offset = a_bytes;
  l.p_offset = l.v_offset + align16(static_cast<size_t>(l.n_pad) * l.v_stride * sizeof(typename Ops::v_t));
  l.state_offset = l.p_offset + p_bytes;
  l.zero_offset = l.state_offset + align16(state_bytes);
  l.bytes = l.zero_offset + 16;
  return l;
}

__device__ __forceinline__ uint32_t float_bits(float x) {
  uint32_t bits;
  memcpy(&bits, &x, sizeof(bits));
  return bits;
}

template <typename T>
__device__ __forceinline__ T* at_offset(unsigned char* base, size_t offset) {
  return reinterpret_cast<T*>(base + offset);
}

// The mma operand type of a 16-bit parameter type.
template <typename scalar_t>
struct MmaOf;
template <>
struct MmaOf<c10::Half> {
  using type = __half;
};
template <>
struct MmaOf<c10::BFloat16> {
  using type = __nv_bfloat16;
};

// A value as stored in V.
template <typename scalar_t, Math math>
__device__ __forceinline__ typename Operands<scalar_t, math>::v_t to_v(AccOf<scalar_t> x) {
  if constexpr (math == Math::kTf32) {
    return ptx::to_tf32(static_cast<float>(x));
  } else {
    return static_cast<typename Operands<scalar_t, math>::v_t>(x);
  }
}

// Loads per thread in flight at once while filling shared memory: each waits
// a trip to L2, so a thread issues several before it stores any.
constexpr int kInFlight = 8;

// Fills A: element (row, k) is `value(row, k)`, in the parameter dtype;
// zeros past k. Consecutive threads take consecutive k of a row, or, with
// `rows_fastest` (for a slice whose rows are columns of W_hh in memory),
// consecutive rows of one k, so that their global reads coalesce. Also zeros
// V's padding rows (batch entries past the batch), which no pass writes.
template <typename scalar_t, Math math, typename Value>
__device__ void load_a(const Layout& l, unsigned char* smem, bool rows_fastest, Value value) {
  using Ops = Operands<scalar_t, math>;
  using a_t = typename Ops::a_t;
  using v_t = typename Ops::v_t;
  a_t* a = at_offset<a_t>(smem, l.a_offset);
  const int n = l.rows * l.a_stride;
  for (int base = threadIdx.x; base < n; base += kInFlight * blockDim.x) {
    a_t x[kInFlight];
    int at[kInFlight];
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      const int e = base + i * blockDim.x;
      const int row = rows_fastest ? e % l.rows : e / l.a_stride;
      const int k = rows_fastest ? e / l.rows : e % l.a_stride;
      at[i] = e < n ? row * l.a_stride + k : -1;
      if (e >= n || k >= l.k) {
        x[i] = static_cast<a_t>(0.0f);
      } else if constexpr (math == Math::kTf32) {
        x[i] = ptx::to_tf32(static_cast<float>(value(row, k)));
      } else {
        x[i] = static_cast<a_t>(value(row, k));
      }
    }
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      if (at[i] >= 0) a[at[i]] = x[i];
    }
  }
  v_t* v = at_offset<v_t>(smem, l.v_offset);
  for (int e = l.batch * l.v_stride + threadIdx.x; e < l.n_pad * l.v_stride; e += blockDim.x) {
    v[e] = static_cast<v_t>(0.0f);
  }
  if (threadIdx.x < 4) at_offset<uint32_t>(smem, l.zero_offset)[threadIdx.x] = 0;
}

// Stages V[n][k0 .. k0 + chunk) for the batch rows: `value(n, k)` (in the
// accumulation dtype) for k < l.k, zeros past it (load_a zeroed the padding rows).
template <typename scalar_t, Math math, typename Value>
__device__ __forceinline__ void stage_v(const Layout& l, unsigned char* smem, int k0, Value value) {
  using acc_t = AccOf<scalar_t>;
  using v_t = typename Operands<scalar_t, math>::v_t;
  v_t* v = at_offset<v_t>(smem, l.v_offset);
  const int n = l.batch * l.chunk;
  for (int base = threadIdx.x; base < n; base += kInFlight * blockDim.x) {
    acc_t x[kInFlight];
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      const int e = base + i * blockDim.x, row = e / l.chunk, k = k0 + e - row * l.chunk;
      x[i] = e < n && k < l.k ? value(row, k) : acc_t(0);
    }
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      const int e = base + i * blockDim.x, row = e / l.chunk;
      if (e < n) v[row * l.v_stride + e - row * l.chunk] = to_v<scalar_t, math>(x[i]);
    }
  }
}

// One pass: adds sum over this chunk's k of A[m][k] V[n][k] into the job's
// slot of P (or sets it, on the first pass). Call between two __syncthreads().
template <typename scalar_t, Math math>
__device__ __forceinline__ void multiply_chunk(const Layout& l, unsigned char* smem, int k0, bool first) {
  using Ops = Operands<scalar_t, math>;
  using acc_t = AccOf<scalar_t>;
  using a_t = typename Ops::a_t;
  using v_t = typename Ops::v_t;
  const a_t* a = at_offset<a_t>(smem, l.a_offset);
  const v_t* v = at_offset<v_t>(smem, l.v_offset);
  acc_t* p = at_offset<acc_t>(smem, l.p_offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int k_len = min(l.chunk, l.k_pad - k0);  // a multiple of the K tile
  const int k_tiles = k_len / Ops::kTileK;
  const int m_tiles = l.rows_pad / Ops::kTileM, n_tiles = l.n_pad / Ops::kTileN;
  const int jobs = m_tiles * n_tiles * l.k_splits;
  const int64_t p_split = static_cast<int64_t>(l.rows_pad) * l.n_pad;
  for (int job = warp; job < jobs; job += kWarps) {
    const int split = job % l.k_splits, tile = job / l.k_splits;
    const int m0 = (tile / n_tiles) * Ops::kTileM, n0 = (tile % n_tiles) * Ops::kTileN;
    const int t_begin = k_tiles * split / l.k_splits, t_end = k_tiles * (split + 1) / l.k_splits;
    acc_t* slot = p + split * p_split;
    if constexpr (math == Math::kFma) {
      acc_t sum = acc_t(0);
      if (m0 < l.rows && n0 < l.batch) {
        for (int kk = t_begin + lane; kk < t_end; kk += 32) {
          sum += static_cast<acc_t>(a[m0 * l.a_stride + k0 + kk]) * v[n0 * l.v_stride + kk];
        }
      }
      sum = warp_sum(sum);
      if (lane == 0) slot[m0 * l.n_pad + n0] = first ? sum : slot[m0 * l.n_pad + n0] + sum;
    } else {
      const int g = lane >> 2, t = lane & 3;
      const void* zero = smem + l.zero_offset;
      // d += the product of K tile kt (in the chunk).
      auto tile = [&](int kt, float(&d)[4]) {
        const int kk = kt * Ops::kTileK;
        uint32_t af[4], bf[2];
        if constexpr (math == Math::kMma16) {
          // ldmatrix: lanes 8i..8i+7 address rows of 8x8 matrix i (A rows
          // m0 + (i & 1) * 8 + r, columns (i >> 1) * 8); rows past `rows` read
          // the zero line.
          const int i = lane >> 3, r = lane & 7, row = m0 + (i & 1) * 8 + r;
          const void* addr = row < l.rows ? static_cast<const void*>(a + row * l.a_stride + k0 + kk + (i >> 1) * 8) : zero;
          ptx::ldmatrix_x4(af, addr);
          const v_t* vrow = v + (n0 + g) * l.v_stride + kk + 2 * t;  // 4-byte aligned: even offsets
          bf[0] = *reinterpret_cast<const uint32_t*>(vrow);
          bf[1] = *reinterpret_cast<const uint32_t*>(vrow + 8);
          ptx::mma_16816<typename MmaOf<scalar_t>::type>(d, af, bf);
        } else {
          const int r0 = m0 + g, r1 = m0 + g + 8, c = k0 + kk + t;
          const float a00 = r0 < l.rows ? a[r0 * l.a_stride + c] : 0.f;
          const float a10 = r1 < l.rows ? a[r1 * l.a_stride + c] : 0.f;
          const float a01 = r0 < l.rows ? a[r0 * l.a_stride + c + 4] : 0.f;
          const float a11 = r1 < l.rows ? a[r1 * l.a_stride + c + 4] : 0.f;
          af[0] = float_bits(a00), af[1] = float_bits(a10), af[2] = float_bits(a01), af[3] = float_bits(a11);
          const v_t* vrow = v + (n0 + g) * l.v_stride + kk + t;
          bf[0] = float_bits(vrow[0]), bf[1] = float_bits(vrow[4]);
          ptx::mma_1688_tf32(d, af, bf);
        }
      };
      // Even and odd K tiles into two accumulators: half the chain of dependent mma.
      float d0[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};
      for (int kt = t_begin; kt < t_end; kt += 2) {
        tile(kt, d0);
        if (kt + 1 < t_end) tile(kt + 1, d1);
      }
      // d[0], d[1]: row g, columns 2t, 2t+1; d[2], d[3]: row g + 8.
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = m0 + g + (i >= 2 ? 8 : 0), col = n0 + 2 * t + (i & 1);
        acc_t* out = slot + row * l.n_pad + col;
        const float d = d0[i] + d1[i];
        *out = first ? d : *out + d;
      }
    }
  }
}

// The product's result for (row, n): the k_splits slots added in order.
template <typename acc_t>
__device__ __forceinline__ acc_t product(const Layout& l, const unsigned char* smem, int row, int n) {
  const acc_t* p = reinterpret_cast<const acc_t*>(smem + l.p_offset) + row * l.n_pad + n;
  const int64_t p_split = static_cast<int64_t>(l.rows_pad) * l.n_pad;
  acc_t sum = p[0];
  for (int s = 1; s < l.k_splits; ++s) sum += p[s * p_split];
  return sum;
}

// The whole product for this step: V staged chunk by chunk from `value(n, k)`.
// Ends with a __syncthreads(), so P is ready for product(). The caller must
// not be reading P or V (a grid sync, or the launch's start, before it).
template <typename scalar_t, Math math, typename Value>
__device__ __forceinline__ void multiply(const Layout& l, unsigned char* smem, Value value) {
  for (int k0 = 0; k0 < l.k_pad; k0 += l.chunk) {
    if (k0 > 0) __syncthreads();  // the previous pass is done with V
    stage_v<scalar_t, math>(l, smem, k0, value);
    __syncthreads();
    multiply_chunk<scalar_t, math>(l, smem, k0, k0 == 0);
  }
  __syncthreads();
}

}  // namespace conveyor::lstm::cuda::block
