#include "ops/tensors_layers.h"

#include <c10/util/Exception.h>

namespace conveyor {

OnSlotImpl::OnSlotImpl(int64_t slot, torch::nn::AnyModule module) : slot_(slot), inner_(std::move(module)) {
  TORCH_CHECK(slot_ >= 0, "conveyor::OnSlot: the slot must be >= 0, got ", slot_);
  TORCH_CHECK(!inner_.is_empty(), "conveyor::OnSlot: the module is empty");
  register_module("inner", inner_.ptr());
}

// Only Cloneable::clone() calls reset(), on a copy of this object that still
// shares the inner module: the copy gets its own.
void OnSlotImpl::reset() {
  inner_ = inner_.clone();
  register_module("inner", inner_.ptr());
}

Tensors OnSlotImpl::forward(Tensors inputs) {
  TORCH_CHECK(slot_ < static_cast<int64_t>(inputs.size()), "conveyor::OnSlot(", slot_, ") received ", inputs.size(),
              " tensor", inputs.size() == 1 ? "" : "s", ", so it has no slot ", slot_);
  inputs[slot_] = inner_.forward<at::Tensor>(inputs[slot_]);
  return inputs;
}

void OnSlotImpl::replace_inner(torch::nn::AnyModule replacement) {
  TORCH_CHECK(!replacement.is_empty(), "conveyor::OnSlot::replace_inner: the replacement module is empty");
  inner_ = std::move(replacement);
  replace_module("inner", inner_.ptr());
}

void OnSlotImpl::pretty_print(std::ostream& stream) const {
  stream << "conveyor::OnSlot(" << slot_ << ", ";
  inner_.ptr()->pretty_print(stream);
  stream << ")";
}

TensorsFunctionImpl::TensorsFunctionImpl(Function function, std::string description, int64_t num_inputs)
    : function_(std::move(function)), description_(std::move(description)), num_inputs_(num_inputs) {
  TORCH_CHECK(function_ != nullptr, "conveyor::TensorsFunction: the function is empty");
}

void TensorsFunctionImpl::pretty_print(std::ostream& stream) const {
  stream << "conveyor::TensorsFunction(" << description_ << ")";
}

}  // namespace conveyor
