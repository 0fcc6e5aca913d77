#pragma once
// Host stand-in for ops/cuda/ptx.cuh (same names), found first on the include
// path when the kernels are compiled for host emulation (../../../emulated_cuda.h).
#include <cstdint>
#include <cmath>
#include <cstring>
namespace conveyor::ptx {
template <typename T>
struct MmaType;
template <>
struct MmaType<__half> { static constexpr bool kIsBFloat16 = false; };
template <>
struct MmaType<__nv_bfloat16> { static constexpr bool kIsBFloat16 = true; };
inline void ldmatrix_x4(uint32_t (&r)[4], const void* smem) { emulated::ldmatrix(r, smem, false); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) { emulated::ldmatrix(r, smem, true); }
template <typename T>
inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  emulated::mma<MmaType<T>::kIsBFloat16>(d, a, b);
}
inline void mma_1688_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  emulated::mma_tf32(d, a, b);
}
inline float to_tf32(float x) { return emulated::round_tf32(x); }
// ex2.approx.ftz: within 2 ulp of 2^x (the emulation computes it exactly, so
// the checks' tolerances must allow for the difference), subnormals to 0.
inline float ex2_approx(float x) {
  const float y = std::exp2(x);
  return std::fpclassify(y) == FP_SUBNORMAL ? 0.f : y;
}
inline void cp_async_16(void* smem, const void* gmem, bool valid) { emulated::cp_async(smem, gmem, valid); }
inline void cp_async_4(void* smem, const void* gmem, bool valid) { emulated::cp_async(smem, gmem, valid, 4); }
inline void cp_async_commit() { emulated::cp_async_commit(); }
template <int kPending>
inline void cp_async_wait() { emulated::cp_async_wait(kPending); }
}  // namespace conveyor::ptx
