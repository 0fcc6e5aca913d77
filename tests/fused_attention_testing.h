#pragma once
// What the fused attention tests share.

#include <ATen/ATen.h>

#include <algorithm>

namespace conveyor {

// max |a - b| / max(max |b|, 1): an error relative to the tensor's own scale,
// or absolute where the reference is all below 1 (a gradient that is exactly
// zero in exact arithmetic, as with a single key, has no scale of its own;
// the inputs here are all of order 1).
inline double relative_error(const at::Tensor& a, const at::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1.0);
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() / scale;
}

}  // namespace conveyor
