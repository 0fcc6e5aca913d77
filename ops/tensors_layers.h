#pragma once
// Ready-made layers of several tensors (see TensorsLayer in ops/adapters.h):
//
//   torch::nn::Sequential seq(
//       conveyor::OnSlot(0, torch::nn::Embedding(V, D)),      // {tokens, mask} -> {embedded, mask}
//       conveyor::OnSlot(0, conveyor::FirstOutput<torch::nn::LSTM>(...)),
//       conveyor::TensorsFunction([](conveyor::Tensors t) {   // plumbing without parameters
//         return conveyor::Tensors{t[0] * t[1].unsqueeze(-1)}; }, "mask"));
//
// OnSlot runs a one-tensor module on one slot of the list and passes the
// others through; TensorsFunction runs a function of the list (reordering,
// dropping, combining). Both clone deeply, and swap_fused_ops reaches the
// module inside an OnSlot.

#include "ops/adapters.h"

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <utility>

namespace conveyor {

class OnSlotImpl : public torch::nn::Cloneable<OnSlotImpl>, public TensorsLayer, public WrapsInnerModule {
 public:
  // `module` takes and returns one tensor; it replaces the tensor at `slot`.
  OnSlotImpl(int64_t slot, torch::nn::AnyModule module);
  template <typename ModuleType>
  OnSlotImpl(int64_t slot, ModuleType module) : OnSlotImpl(slot, torch::nn::AnyModule(std::move(module))) {}

  void reset() override;
  Tensors forward(Tensors inputs) override;

  int64_t slot() const { return slot_; }
  std::shared_ptr<torch::nn::Module> inner() const override { return inner_.ptr(); }
  void replace_inner(torch::nn::AnyModule replacement) override;
  void pretty_print(std::ostream& stream) const override;

 private:
  int64_t slot_;
  torch::nn::AnyModule inner_;
};

class OnSlot : public torch::nn::ModuleHolder<OnSlotImpl> {
 public:
  using torch::nn::ModuleHolder<OnSlotImpl>::ModuleHolder;
};

class TensorsFunctionImpl : public torch::nn::Cloneable<TensorsFunctionImpl>, public TensorsLayer {
 public:
  using Function = std::function<Tensors(Tensors)>;
  // `description` names the function in messages ("mask", "drop the source").
  // num_inputs: how many tensors it takes (-1: any), checked before each call.
  explicit TensorsFunctionImpl(Function function, std::string description = "function", int64_t num_inputs = -1);

  void reset() override {}
  Tensors forward(Tensors inputs) override { return function_(std::move(inputs)); }
  int64_t num_inputs() const override { return num_inputs_; }
  void pretty_print(std::ostream& stream) const override;

 private:
  Function function_;
  std::string description_;
  int64_t num_inputs_;
};

class TensorsFunction : public torch::nn::ModuleHolder<TensorsFunctionImpl> {
 public:
  using torch::nn::ModuleHolder<TensorsFunctionImpl>::ModuleHolder;
};

}  // namespace conveyor
