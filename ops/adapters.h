#pragma once
// Adapters: how layers that are not "one tensor in, one tensor out" join a
// pipeline, with no special case in the runtime.
//
// Between layers and stages the runtime passes a list of tensors (Tensors).
// A plain layer (Linear, Embedding, ...) takes and returns one: it sees a
// list of exactly one. A layer of several tensors derives from TensorsLayer;
// OnSlot and TensorsFunction (ops/tensors_layers.h) make such layers from
// plain modules and functions.
//
// A layer that returns a tuple (torch::nn::LSTM returns (output, (h_n, c_n)))
// is wrapped in FirstOutput, which keeps element 0 and drops the rest; the
// initial state is left to the layer's default (zeros), as in an unrolled
// language model.
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

#include <cstdint>
#include <memory>
#include <ostream>
#include <tuple>
#include <utility>
#include <vector>

namespace conveyor {

// What crosses a layer or stage boundary: an ordered list of tensors of any
// dtypes; a slot may be undefined. Floating tensors that need a gradient get
// one back in the backward; integer and boolean ones (token ids, lengths,
// masks) travel forward only.
using Tensors = std::vector<at::Tensor>;

// A layer of several tensors: derive the module from TensorsLayer as well as
// torch::nn::Module (or Cloneable) and implement forward over the list,
//
//   struct DecoderImpl : torch::nn::Cloneable<DecoderImpl>, conveyor::TensorsLayer {
//     conveyor::Tensors forward(conveyor::Tensors in) override {  // {memory, target}
//       return {in[0], attend(in[0], embed(in[1]))};              // memory rides along
//     }
//   };
//
// A tensor passed on unchanged (an encoder's output that later stages read)
// stays differentiable: its gradient from later stages flows back to where it
// was made, summed with the uses on the way.
class TensorsLayer {
 public:
  virtual ~TensorsLayer() = default;
  virtual Tensors forward(Tensors inputs) = 0;
  // How many tensors forward() takes; -1 for any number. The stage checks it
  // before the call, so a mismatch names the layer and both counts.
  virtual int64_t num_inputs() const { return -1; }
};

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
