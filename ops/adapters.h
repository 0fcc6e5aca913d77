#pragma once
// Adapters: the runtime passes one tensor between layers. A layer that returns
// a tuple (torch::nn::LSTM returns (output, (h_n, c_n))) is wrapped in
// FirstOutput, which keeps element 0 and drops the rest; the initial state is
// left to the layer's default (zeros), as in an unrolled language model.
//
//   seq->push_back(conveyor::FirstOutput<torch::nn::LSTM>(
//       torch::nn::LSTMOptions(128, 256).batch_first(true)));
//
// The wrapper registers the inner module as "inner", so parameter names read
// "1.inner.weight_ih_l0". It is Cloneable: Sequential::clone() deep-copies it.
//
// The inner module is held as a torch::nn::AnyModule, not as a typed member,
// so that it can be exchanged for another module with the same forward
// signature (conveyor::swap_fused_ops puts a FusedLSTM in place of an LSTM)
// without leaving a stale typed handle behind.

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <ostream>
#include <tuple>
#include <utility>

namespace conveyor {

// An adapter around one inner module that may be replaced in place.
class WrapsInnerModule {
 public:
  virtual ~WrapsInnerModule() = default;
  virtual std::shared_ptr<torch::nn::Module> inner() const = 0;
  // `replacement` must have the inner module's forward signature.
  virtual void replace_inner(torch::nn::AnyModule replacement) = 0;
};

template <typename Holder>
class FirstOutputImpl : public torch::nn::Cloneable<FirstOutputImpl<Holder>>, public WrapsInnerModule {
 public:
  using Options = decltype(Holder::Impl::options);  // e.g. torch::nn::LSTMOptions
  // What the inner module's forward(input) returns, e.g. (output, (h_n, c_n)).
  using InnerOutput = decltype(std::declval<typename Holder::Impl&>().forward(std::declval<const at::Tensor&>()));

  explicit FirstOutputImpl(Options options) : options_(std::move(options)) { reset(); }

  // A new FirstOutput builds its inner module from the options. Cloneable's
  // clone() copies this object and then calls reset(): the copy must get an
  // inner module of the same kind as the original's (which may have been
  // swapped), so an existing inner module is deep-copied instead.
  void reset() override {
    inner_ = inner_.is_empty() ? torch::nn::AnyModule(Holder(options_)) : inner_.clone();
    this->register_module("inner", inner_.ptr());
  }

  at::Tensor forward(const at::Tensor& input) { return std::get<0>(inner_.forward<InnerOutput>(input)); }

  std::shared_ptr<torch::nn::Module> inner() const override { return inner_.ptr(); }

  void replace_inner(torch::nn::AnyModule replacement) override {
    TORCH_CHECK(!replacement.is_empty(), "FirstOutput::replace_inner: the replacement module is empty");
    inner_ = std::move(replacement);
    this->replace_module("inner", inner_.ptr());
  }

  void pretty_print(std::ostream& stream) const override {
    stream << "conveyor::FirstOutput<";
    inner_.ptr()->pretty_print(stream);
    stream << ">";
  }

 private:
  Options options_;
  torch::nn::AnyModule inner_;
};

// A module holder, so FirstOutput<torch::nn::LSTM>(options) reads like torch::nn.
template <typename Holder>
class FirstOutput : public torch::nn::ModuleHolder<FirstOutputImpl<Holder>> {
 public:
  using torch::nn::ModuleHolder<FirstOutputImpl<Holder>>::ModuleHolder;
};

}  // namespace conveyor
