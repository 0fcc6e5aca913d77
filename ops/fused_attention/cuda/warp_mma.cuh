#pragma once
// Warp-level building blocks of the tensor-core kernels, made of the
// instructions in ops/cuda/ptx.cuh: fragment loads of 16-bit tiles from shared memory,
// the register packing between accumulators and operands, quad reductions,
// and asynchronous tile copies.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with
// g = lane / 4 and t = lane % 4:
//   A 16x16, four 32-bit registers of two elements each:
//     a[0] = (row g,   cols 2t, 2t+1)   a[1] = (row g+8, cols 2t, 2t+1)
//     a[2] = (row g,   cols 2t+8, +9)   a[3] = (row g+8, cols 2t+8, +9)
//   B 16x8: b[0] = (rows 2t, 2t+1, col g)   b[1] = (rows 2t+8, 2t+9, col g)
//   C/D 16x8 float: c[0], c[1] = (row g, cols 2t, 2t+1); c[2], c[3] = row g+8.
// So the C fragments of two adjacent 8-column tiles are, once rounded to
// 16 bits, exactly the A fragment of the 16-column block they cover: scores
// never leave registers between the two GEMMs of attention.
//
// ldmatrix.x4: lanes 8i..8i+7 give the row addresses of 8x8 matrix i; every
// lane receives, in register i, row g cols 2t, 2t+1 of matrix i (.trans:
// rows 2t, 2t+1 of col g). The load_* helpers choose the four matrices so
// that the registers land in the A or B layout above.

#include "ops/cuda/ptx.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

namespace conveyor::attention::cuda {

using ptx::cp_async_16;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::ldmatrix_x4;
using ptx::ldmatrix_x4_trans;
using ptx::mma_16816;
using ptx::MmaType;

// Two floats rounded to T, the first in the low half (the lower column).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t bits;
  if constexpr (MmaType<T>::kIsBFloat16) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&bits, &v, sizeof(bits));
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&bits, &v, sizeof(bits));
  }
  return bits;
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// A fragment of the 16x16 block at (row0, col0) of a row-major tile.
template <typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* tile, int stride, int row0, int col0, int lane) {
  const int i = lane >> 3, r = lane & 7;
  ldmatrix_x4(a, tile + (row0 + (i & 1) * 8 + r) * stride + col0 + (i >> 1) * 8);
}

// B fragments of two adjacent 8-column tiles, B[k][n] = M[n0 + n][k0 + k],
// where M is a row-major tile whose rows are B's columns (K in Q K^T).
template <typename T>
__device__ __forceinline__ void load_b_rows(uint32_t (&b)[2][2], const T* tile, int stride, int n0, int k0, int lane) {
  const int i = lane >> 3, r = lane & 7;
  uint32_t x[4];
  ldmatrix_x4(x, tile + (n0 + (i >> 1) * 8 + r) * stride + k0 + (i & 1) * 8);
  b[0][0] = x[0];
  b[0][1] = x[1];
  b[1][0] = x[2];
  b[1][1] = x[3];
}

// B fragments of two adjacent 8-column tiles, B[k][n] = M[k0 + k][n0 + n],
// where M is a row-major tile whose rows are B's rows (V in P V).
template <typename T>
__device__ __forceinline__ void load_b_cols(uint32_t (&b)[2][2], const T* tile, int stride, int k0, int n0, int lane) {
  const int i = lane >> 3, r = lane & 7;
  uint32_t x[4];
  ldmatrix_x4_trans(x, tile + (k0 + (i & 1) * 8 + r) * stride + n0 + (i >> 1) * 8);
  b[0][0] = x[0];
  b[0][1] = x[1];
  b[1][0] = x[2];
  b[1][1] = x[3];
}

// The A fragment of the 16-column block covered by C tiles c_lo and c_hi.
template <typename T>
__device__ __forceinline__ void accumulators_to_a(uint32_t (&a)[4], const float (&c_lo)[4], const float (&c_hi)[4]) {
  a[0] = pack2<T>(c_lo[0], c_lo[1]);
  a[1] = pack2<T>(c_lo[2], c_lo[3]);
  a[2] = pack2<T>(c_hi[0], c_hi[1]);
  a[3] = pack2<T>(c_hi[2], c_hi[3]);
}

// Copies rows [row0, row0 + kRows) x kCols of a row-major [rows, kCols]
// global matrix into a tile with row stride `stride`, 16 bytes per cp.async;
// rows at or past `rows` become zeros.
template <int kRows, int kCols, int kThreads, typename T>
__device__ __forceinline__ void copy_tile_async(T* tile, int stride, const T* global, int row0, int rows, int tid) {
  constexpr int kChunksPerRow = kCols * static_cast<int>(sizeof(T)) / 16;
  constexpr int kChunks = kRows * kChunksPerRow;
  constexpr int kPerChunk = 16 / static_cast<int>(sizeof(T));
  for (int c = tid; c < kChunks; c += kThreads) {
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * kPerChunk;
    const bool valid = row0 + r < rows;
    const T* src = valid ? global + static_cast<int64_t>(row0 + r) * kCols + col : global;
    cp_async_16(tile + r * stride + col, src, valid);
  }
}

}  // namespace conveyor::attention::cuda
