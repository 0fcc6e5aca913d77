#include "ops/nonfinite/nonfinite.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

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

at::Tensor count_nonfinite_cpu(at::TensorList tensors) {
  at::Tensor count = at::zeros({}, at::kLong);
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(t.device().is_cpu(), "conveyor::count_nonfinite: all tensors must be on one device, got ", t.device(),
                " among CPU tensors");
    if (t.is_floating_point() || t.is_complex()) count += at::logical_not(at::isfinite(t)).sum();
  }
  return count;
}

}  // namespace

TORCH_LIBRARY_IMPL(conveyor, CPU, m) { m.impl("count_nonfinite", &count_nonfinite_cpu); }

}  // namespace conveyor
