#pragma once
// Argument checks shared by the CPU and CUDA bindings, so that both reject the
// same inputs with the same messages, each naming the offending tensor and
// dimension.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace conveyor::attention {

struct AttentionShape {
  int64_t batch = 0;
  int64_t heads = 0;
  int64_t q_len = 0;
  int64_t k_len = 0;
  int64_t head_dim = 0;
};

// q [B, H, S_q, D], k and v [B, H, S_k, D], one floating dtype and one device;
// key_padding_mask, when given, a bool [B, S_k] on that device.
AttentionShape check_forward_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const std::optional<at::Tensor>& key_padding_mask);

// The forward's checks, plus grad_out and out shaped like q and lse [B, H, S_q].
AttentionShape check_backward_inputs(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                     const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                     const std::optional<at::Tensor>& key_padding_mask);

// The softmax scale: the caller's, or 1/sqrt(head_dim). Must be finite.
double resolve_scale(std::optional<double> scale, int64_t head_dim);

// dtype of lse and of the CPU reference's arithmetic: float64 for float64
// inputs, float32 otherwise.
at::ScalarType accumulate_dtype(at::ScalarType input);

// The mask as a defined tensor or an undefined one (None and undefined alike).
inline at::Tensor mask_or_undefined(const std::optional<at::Tensor>& mask) {
  return mask.has_value() ? *mask : at::Tensor();
}

}  // namespace conveyor::attention
