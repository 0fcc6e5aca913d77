#pragma once
// count_nonfinite: how many elements of a list of tensors are NaN or
// infinite, as an int64 scalar tensor on their device. One device-side
// reduction per tensor and no host synchronisation until the caller reads the
// result, so a divergence guard can check every gradient of a stage at once.
// Registered as conveyor::count_nonfinite (CPU and CUDA).

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

namespace conveyor {

// Integer and boolean tensors count as finite. All tensors must be on one
// device; an empty list gives a CPU zero.
at::Tensor count_nonfinite(at::TensorList tensors);

// count_nonfinite(tensors) == 0, read on the host.
bool all_finite(at::TensorList tensors);

}  // namespace conveyor
