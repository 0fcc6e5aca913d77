#include "ops/nonfinite/nonfinite.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cmath>

namespace conveyor {

at::Tensor count_nonfinite(at::TensorList tensors) {
  if (tensors.empty()) return at::zeros({}, at::kLong);
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("conveyor::count_nonfinite", "")
                             .typed<at::Tensor(at::TensorList)>();
  return op.call(tensors);
}

bool all_finite(at::TensorList tensors) { return count_nonfinite(tensors).item<int64_t>() == 0; }

TORCH_LIBRARY_FRAGMENT(conveyor, m) {
  // NaN and infinite elements across the tensors, as an int64 scalar on their device.
  m.def("count_nonfinite(Tensor[] tensors) -> Tensor");
}

namespace {

// A sum is finite when every element is (NaN and infinities propagate), so
// one vectorised pass clears a finite tensor, which is what a guard sees on
// almost every step; only a tensor whose sum is not finite (a non-finite
// element, or finite ones that overflow) is counted element by element. On
// the CPU reading the sum costs no device synchronisation.
at::Tensor count_nonfinite_cpu(at::TensorList tensors) {
  int64_t count = 0;
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(t.device().is_cpu(), "conveyor::count_nonfinite: all tensors must be on one device, got ", t.device(),
                " among CPU tensors");
    if (!t.is_floating_point() && !t.is_complex()) continue;
    const at::Tensor values = t.is_complex() ? at::view_as_real(t.resolve_conj()) : t;
    // Half-precision sums overflow early: add those up in float.
    const bool narrow = values.scalar_type() == at::kHalf || values.scalar_type() == at::kBFloat16;
    const at::Tensor sum = narrow ? at::sum(values, at::kFloat) : at::sum(values);
    if (std::isfinite(sum.item<double>())) continue;
    count += at::logical_not(at::isfinite(t)).sum().item<int64_t>();
  }
  return at::scalar_tensor(count, at::kLong);
}

}  // namespace

TORCH_LIBRARY_IMPL(conveyor, CPU, m) { m.impl("count_nonfinite", &count_nonfinite_cpu); }

}  // namespace conveyor
