#pragma once
// Device helpers shared by the fused LSTM kernels: the cell update in the
// accumulation dtype, warp sums, and loads that bypass L1 for data another
// block wrote during the same (persistent) launch.

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

// The block's dynamic shared memory (the host emulation gives each block its own).
#ifndef CONVEYOR_DYNAMIC_SHARED_MEMORY
#define CONVEYOR_DYNAMIC_SHARED_MEMORY(name) extern __shared__ __align__(16) unsigned char name[]
#endif

namespace conveyor::lstm::cuda {

__device__ __forceinline__ float exp_acc(float x) { return expf(x); }
__device__ __forceinline__ double exp_acc(double x) { return exp(x); }
__device__ __forceinline__ float tanh_acc(float x) { return tanhf(x); }
__device__ __forceinline__ double tanh_acc(double x) { return tanh(x); }

template <typename acc_t>
__device__ __forceinline__ acc_t sigmoid_acc(acc_t x) {
  return acc_t(1) / (acc_t(1) + exp_acc(-x));
}

template <typename acc_t>
struct CellResult {
  acc_t i, f, g, o;  // activated gates
  acc_t c, h;
};

// torch::nn::LSTM's cell: i, f, o = sigmoid, g = tanh, c = f c' + i g, h = o tanh(c).
template <typename acc_t>
__device__ __forceinline__ CellResult<acc_t> lstm_cell(const acc_t (&pre)[4], acc_t c_prev) {
  CellResult<acc_t> r;
  r.i = sigmoid_acc(pre[0]);
  r.f = sigmoid_acc(pre[1]);
  r.g = tanh_acc(pre[2]);
  r.o = sigmoid_acc(pre[3]);
  r.c = r.f * c_prev + r.i * r.g;
  r.h = r.o * tanh_acc(r.c);
  return r;
}

// The sum over a warp's 32 lanes, in every lane (a butterfly: each lane
// adds the same pairs in the same order, so all get the same bits). The host
// emulation brings its own, one collective instead of five.
#ifndef CONVEYOR_EMULATED_WARP_SUM
template <typename acc_t>
__device__ __forceinline__ acc_t warp_sum(acc_t v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
#endif

// Global loads cached in L2 only: L1 is not coherent across blocks.
__device__ __forceinline__ float load_cg(const float* p) { return __ldcg(p); }
__device__ __forceinline__ double load_cg(const double* p) { return __ldcg(p); }
__device__ __forceinline__ float load_cg(const c10::Half* p) {
  const unsigned short bits = __ldcg(reinterpret_cast<const unsigned short*>(p));
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}
__device__ __forceinline__ float load_cg(const c10::BFloat16* p) {
  const unsigned short bits = __ldcg(reinterpret_cast<const unsigned short*>(p));
  return static_cast<float>(c10::BFloat16(bits, c10::BFloat16::from_bits()));
}

}  // namespace conveyor::lstm::cuda
