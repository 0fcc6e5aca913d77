#include "plugin/support/tensors.h"

namespace conveyor {

int64_t tensor_bytes(const at::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size()) : 0;
}

int64_t tensor_bytes(const Tensors& tensors) {
  int64_t total = 0;
  for (const auto& t : tensors) total += tensor_bytes(t);
  return total;
}

Tensors as_input_leaves(Tensors tensors) {
  for (auto& t : tensors) {
    if (t.defined() && t.is_floating_point()) t = t.detach().requires_grad_(true);
  }
  return tensors;
}

}  // namespace conveyor
