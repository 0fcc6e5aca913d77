#pragma once
// Small operations on the lists of tensors that cross stage boundaries.

#include "ops/adapters.h"

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace conveyor {

int64_t tensor_bytes(const at::Tensor& t);  // 0 for an undefined tensor
int64_t tensor_bytes(const Tensors& tensors);

// A stage's received inputs as it differentiates them: each floating tensor
// becomes a leaf whose gradient goes back to the previous stage; the others
// (token ids, masks) pass unchanged.
Tensors as_input_leaves(Tensors tensors);

}  // namespace conveyor
