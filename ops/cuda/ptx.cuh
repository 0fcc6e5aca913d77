#pragma once
// Thin wrappers over the PTX instructions the tensor-core kernels use:
// ldmatrix, mma.sync m16n8k16 (float16 / bfloat16 in, float32 accumulate),
// mma.sync m16n8k8 on TF32, the float -> TF32 rounding, ex2.approx and
// cp.async. Nothing
// here knows about attention or LSTMs; the ops compose these into fragment
// loads (ops/fused_attention/cuda/warp_mma.cuh, ops/fused_lstm/cuda/
// lstm_block_product.cuh). The host emulation has a stand-in of the same names
// (ops/cuda/host_emulation/include/ops/cuda/ptx.cuh).

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace conveyor::ptx {

template <typename T>
struct MmaType;
template <>
struct MmaType<__half> {
  static constexpr bool kIsBFloat16 = false;
};
template <>
struct MmaType<__nv_bfloat16> {
  static constexpr bool kIsBFloat16 = true;
};

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(smem)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(smem)));
}

// d += a * b for one 16x8x16 tile.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (MmaType<T>::kIsBFloat16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

// d += a * b for one 16x8x8 tile of TF32 operands (each a float whose low 13
// mantissa bits the tensor core ignores: round them with to_tf32 first).
// Fragments, g = lane / 4, t = lane % 4: a[0] = A[g][t], a[1] = A[g+8][t],
// a[2] = A[g][t+4], a[3] = A[g+8][t+4]; b[0] = B[t][g], b[1] = B[t+4][g];
// d as in mma_16816.
__device__ __forceinline__ void mma_1688_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// x rounded to TF32 (10 mantissa bits, to nearest, ties away from zero), as
// cuBLAS and cuDNN round their TF32 inputs; the low 13 bits become zero.
__device__ __forceinline__ float to_tf32(float x) {
  uint32_t bits;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(bits) : "f"(x));
  return __uint_as_float(bits);
}

// 2^x, the special-function unit's approximation (2 ulp; subnormals flushed
// to zero): what exp2f compiles to under --use_fast_math, here on request.
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 16 bytes global -> shared, asynchronously; zero-fills when !valid (rows past
// the end of a sequence), so no tile ever holds stale or uninitialised data.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(smem)), "l"(gmem),
               "r"(src_bytes));
}

// 4 bytes global -> shared, asynchronously (through L1: .cg takes 16 only);
// zero-fills when !valid.
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(smem)), "l"(gmem),
               "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most `kPending` of this thread's committed groups are in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

}  // namespace conveyor::ptx
