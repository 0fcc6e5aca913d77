#include "plugin/script/script_layer.h"

#include "plugin/script/script_nodes.h"

#include <c10/util/Exception.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace conveyor {

namespace {

// The submodule of `root` at `path` ("" is root itself).
torch::jit::Module submodule_at(const torch::jit::Module& root, const std::string& path) {
  torch::jit::Module m = root;
  if (path.empty()) return m;
  for (const auto& part : split_path(path)) {
    TORCH_CHECK(m.hasattr(part) && m.attr(part).isModule(), "conveyor: the TorchScript model has no submodule '", path,
                "'");
    m = m.attr(part).toModule();
  }
  return m;
}

void set_script_training(const torch::jit::Module& m, bool on, bool recursive) {
  if (recursive) {
    torch::jit::Module(m).train(on);
  } else if (m.hasattr("training")) {
    m._ivalue()->setAttr("training", on);
  }
}

}  // namespace

// Holds the registered parameters and buffers below a ScriptLayer, one per
// path component, so names read like the TorchScript model's.
class ScriptState : public torch::nn::Module {
 public:
  ScriptState() : torch::nn::Module("conveyor::ScriptState") {}
  void replace_parameter(const std::string& name, const at::Tensor& tensor) {
    TORCH_CHECK(parameters_.contains(name), "conveyor: no parameter '", name, "' to replace");
    parameters_[name] = tensor;
  }
};

ScriptLayerImpl::ScriptLayerImpl(torch::jit::Module module, std::string prefix, ScriptLayerOptions options)
    : owner_(std::move(module)), prefix_(std::move(prefix)), options_(options) {
  std::vector<std::string> names;
  for (const auto& p : owner_.named_parameters(/*recurse=*/true)) names.push_back(p.name);
  for (const auto& b : owner_.named_buffers(/*recurse=*/true)) names.push_back(b.name);
  register_state(names);
  description_ = (prefix_.empty() ? std::string("the model") : prefix_) + ": " + owner_.type()->name()->qualifiedName();
  torch::nn::Module::train(owner_.is_training());
}

ScriptLayerImpl::ScriptLayerImpl(torch::jit::Module owner, std::shared_ptr<torch::jit::GraphFunction> segment,
                                 const std::vector<std::string>& state, std::vector<std::string> submodules,
                                 std::string description, ScriptLayerOptions options, std::vector<std::string> fed)
    : owner_(std::move(owner)),
      segment_(std::move(segment)),
      state_(state),
      submodules_(std::move(submodules)),
      fed_(std::move(fed)),
      description_(std::move(description)),
      options_(options) {
  TORCH_CHECK(segment_ != nullptr, "conveyor: ScriptLayer needs a segment function");
  register_state(state_);
  const auto params = named_parameters();
  const auto buffers = named_buffers();
  for (const auto& name : fed_) {
    const at::Tensor* t = params.find(name);
    if (!t) t = buffers.find(name);
    TORCH_CHECK(t != nullptr, "conveyor: ", description_, " is fed '", name, "', which it does not hold");
    fed_tensors_.push_back(*t);
  }
  torch::nn::Module::train(owner_.is_training());
}

void ScriptLayerImpl::register_state(const std::vector<std::string>& names) {
  for (const auto& name : names) {
    const auto parts = split_path(name);
    // Walk (creating as needed) one holder module per path component, so the
    // registered name reads exactly like the TorchScript one.
    torch::nn::Module* holder = this;
    torch::jit::Module script = owner_;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      script = script.attr(parts[i]).toModule();
      auto children = holder->named_children();
      std::shared_ptr<torch::nn::Module> child;
      if (const auto* found = children.find(parts[i])) {
        child = *found;
      } else {
        child = holder->register_module(parts[i], std::make_shared<ScriptState>());
      }
      holder = child.get();
    }
    const std::string& leaf = parts.back();
    TORCH_CHECK(script.hasattr(leaf), "conveyor: the TorchScript model has no parameter or buffer '", name, "'");
    const c10::IValue value = script.attr(leaf);
    TORCH_CHECK(value.isTensor(), "conveyor: TorchScript attribute '", name, "' is not a tensor");
    const at::Tensor tensor = value.toTensor();
    const auto slot = script.type()->findAttributeSlot(leaf);
    if (slot && script.type()->is_parameter(*slot)) {
      holder->register_parameter(leaf, tensor, tensor.requires_grad());
    } else {
      holder->register_buffer(leaf, tensor);
    }
  }
}

Tensors ScriptLayerImpl::forward(Tensors inputs) {
  torch::jit::GraphOptimizerEnabledGuard optimize(options_.optimize);
  c10::IValue out;
  if (segment_) {
    torch::jit::Stack stack{owner_._ivalue()};
    for (auto& t : inputs) stack.emplace_back(std::move(t));
    for (const auto& t : fed_tensors_) stack.emplace_back(t);
    segment_->run(stack);
    TORCH_CHECK(stack.size() == 1, "conveyor: a TorchScript segment left ", stack.size(), " values, expected 1");
    out = std::move(stack.back());
  } else {
    out = owner_.forward({std::move(inputs.at(0))});
  }
  Tensors outputs;
  if (out.isTuple()) {
    const auto& elements = out.toTupleRef().elements();
    TORCH_CHECK(!elements.empty(), "conveyor: TorchScript ", description_, " returned an empty tuple");
    const size_t kept = segment_ ? elements.size() : 1;
    for (size_t i = 0; i < kept; ++i) {
      TORCH_CHECK(elements[i].isTensor(), "conveyor: TorchScript ", description_, " returned a ",
                  elements[i].tagKind(), " as element ", i, " of its tuple, but only tensors travel between layers");
      outputs.push_back(elements[i].toTensor());
    }
    return outputs;
  }
  TORCH_CHECK(out.isTensor(), "conveyor: TorchScript ", description_, " returned a ", out.tagKind(),
              ", but a pipeline layer must return a tensor (or a tuple of tensors)");
  outputs.push_back(out.toTensor());
  return outputs;
}

int64_t ScriptLayerImpl::num_inputs() const {
  return segment_ ? static_cast<int64_t>(segment_->graph()->inputs().size() - 1 - fed_.size()) : 1;
}

void ScriptLayerImpl::rebind_parameter(const std::string& name, const at::Tensor& replacement) {
  const auto parts = split_path(name);
  torch::nn::Module* holder = this;
  std::string parent;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    holder = holder->named_children()[parts[i]].get();
    parent += (i ? "." : "") + parts[i];
  }
  auto* state = dynamic_cast<ScriptState*>(holder);
  TORCH_CHECK(state != nullptr || holder == this, "conveyor: ", description_, " holds no parameter '", name, "'");
  if (state) {
    state->replace_parameter(parts.back(), replacement);
  } else {
    TORCH_CHECK(parameters_.contains(parts.back()), "conveyor: ", description_, " holds no parameter '", name, "'");
    parameters_[parts.back()] = replacement;
  }
  const auto fed = std::find(fed_.begin(), fed_.end(), name);
  if (fed != fed_.end()) {
    fed_tensors_[fed - fed_.begin()] = replacement;  // the owner's attribute stays the earlier stage's
  } else {
    submodule_at(owner_, parent).setattr(parts.back(), replacement);
  }
}

void ScriptLayerImpl::train(bool on) {
  torch::nn::Module::train(on);
  if (!segment_) {
    set_script_training(owner_, on, /*recursive=*/true);
    return;
  }
  // A segment shares its owner with the other segments: set only what it runs.
  set_script_training(owner_, on, /*recursive=*/false);
  for (const auto& path : submodules_) set_script_training(submodule_at(owner_, path), on, /*recursive=*/true);
}

std::shared_ptr<torch::nn::Module> ScriptLayerImpl::clone(const std::optional<torch::Device>& device) const {
  std::shared_ptr<ScriptLayerImpl> copy;
  if (segment_) {
    // deepcopy keeps the class type, so the segment's graph applies to the copy.
    copy = std::make_shared<ScriptLayerImpl>(owner_.deepcopy(), segment_, state_, submodules_, description_, options_,
                                             fed_);
  } else {
    copy = std::make_shared<ScriptLayerImpl>(owner_.deepcopy(), prefix_, options_);
  }
  copy->prefix_ = prefix_;
  copy->train(is_training());
  if (device) copy->to(*device);
  return copy;
}

void ScriptLayerImpl::clone_(torch::nn::Module& other, const std::optional<torch::Device>& device) {
  auto* source = dynamic_cast<ScriptLayerImpl*>(&other);
  TORCH_CHECK(source != nullptr, "conveyor: cannot make a ScriptLayer a clone of a ", other.name());
  *this = *std::static_pointer_cast<ScriptLayerImpl>(source->clone(device));
}

void ScriptLayerImpl::pretty_print(std::ostream& stream) const {
  stream << "conveyor::ScriptLayer(" << description_ << ")";
}

}  // namespace conveyor
