#pragma once
// Plain parameter blocks handed from the binding (fused_attention_cuda.cpp, which
// knows ATen) to the kernels and launchers (.cu files, which do not), so that
// nvcc never compiles ATen headers. Every tensor is contiguous [B, H, S, D].

#include <cuda_runtime_api.h>

#include <cstdint>

namespace conveyor::attention::cuda {

enum class ElementType { kHalf, kBFloat16, kFloat, kDouble };

// The tensor-core kernels a call may run (their names: fused_kernel_names("attention")).
enum class FlashKernel { kTiles128, kV1 };

struct ForwardParams {
  const void* q = nullptr;                    // [B, H, S_q, D]
  const void* k = nullptr;                    // [B, H, S_k, D]
  const void* v = nullptr;                    // [B, H, S_k, D]
  const uint8_t* key_padding_mask = nullptr;  // [B, S_k], nonzero = ignore; may be null
  void* out = nullptr;                        // [B, H, S_q, D], the inputs' dtype
  void* lse = nullptr;                        // [B, H, S_q], float (double for kDouble)
  int batch = 0, heads = 0, q_len = 0, k_len = 0, head_dim = 0;
  double scale = 1.0;
  bool causal = false;  // key j hidden from query i when j > i (top-left aligned)
  ElementType dtype = ElementType::kFloat;
  FlashKernel flash_kernel = FlashKernel::kTiles128;  // which tensor-core forward, where one runs
};

struct BackwardParams {
  ForwardParams fwd;               // q, k, v, out, lse and the shape of the forward
  const void* grad_out = nullptr;  // [B, H, S_q, D]
  void* row_dot = nullptr;         // workspace [B, H, S_q]: rowsum(grad_out * out), lse's dtype
  float* grad_q_accum = nullptr;   // workspace [B, H, S_q, D] float, zeroed (tensor-core path only)
  void* grad_q = nullptr;          // outputs, the inputs' dtype (grad_q unused on the tensor-core path,
  void* grad_k = nullptr;          // whose caller converts grad_q_accum, already scaled, instead)
  void* grad_v = nullptr;
};

// Tensor-core path: float16 / bfloat16 with head_dim 64 or 128.
inline bool flash_supports(ElementType dtype, int head_dim) {
  return (dtype == ElementType::kHalf || dtype == ElementType::kBFloat16) && (head_dim == 64 || head_dim == 128);
}
// ... whose 16-byte copies (cp.async) need 16-byte aligned rows: a contiguous
// view that starts inside its storage (x[1:], a chunk of a fused projection)
// keeps its offset through .contiguous() and may not be. Such calls take the
// general kernels, which read element by element.
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
inline bool flash_takes(const ForwardParams& p) {
  return flash_supports(p.dtype, p.head_dim) && aligned16(p.q) && aligned16(p.k) && aligned16(p.v) &&
         aligned16(p.out);
}
inline bool flash_takes(const BackwardParams& p) {
  return flash_takes(p.fwd) && aligned16(p.grad_out) && aligned16(p.grad_k) && aligned16(p.grad_v);
}
void launch_flash_forward(const ForwardParams& params, cudaStream_t stream);
void launch_flash_backward(const BackwardParams& params, cudaStream_t stream);

// Any dtype and head_dim (up to the device's shared memory; the launcher
// raises naming head_dim when it does not fit).
void launch_simple_forward(const ForwardParams& params, cudaStream_t stream);
void launch_simple_backward(const BackwardParams& params, cudaStream_t stream);

// rowsum(grad_out * out) per query row, in lse's dtype; both paths use it.
void launch_row_dot(const BackwardParams& params, cudaStream_t stream);

}  // namespace conveyor::attention::cuda
