#include "plugin/export/export_layer.h"

#include "plugin/core/errors.h"
#include "plugin/export/interpreter.h"

#include <ATen/ops/scalar_tensor.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <sstream>

namespace conveyor {

namespace {

std::vector<std::string> split_name(const std::string& name) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i <= name.size(); ++i) {
    if (i == name.size() || name[i] == '.') {
      parts.push_back(name.substr(start, i - start));
      start = i + 1;
    }
  }
  return parts;
}

}  // namespace

// Holds the registered tensors below an ExportLayer, one per path component.
class ExportState : public torch::nn::Module {
 public:
  ExportState() : torch::nn::Module("conveyor::ExportState") {}
  void replace_parameter(const std::string& name, const at::Tensor& tensor) {
    TORCH_CHECK(parameters_.contains(name), "conveyor: no parameter '", name, "' to replace");
    parameters_[name] = tensor;
  }
};

ExportLayerImpl::ExportLayerImpl(std::shared_ptr<const exported::Program> program, exported::Segment segment,
                                 const std::map<std::string, at::Tensor>& tensors, std::string where)
    : torch::nn::Module("conveyor::ExportLayer"),
      program_(std::move(program)),
      segment_(std::move(segment)),
      where_(std::move(where)) {
  for (const std::string& name : segment_.state) {
    const exported::State* st = nullptr;
    const auto it = tensors.find(name);
    check_argument(it != tensors.end(), where_, " holds no tensor for '", name, "', which the program reads");
    const at::Tensor& t = it->second;
    const bool mutated = std::any_of(program_->buffer_mutations.begin(), program_->buffer_mutations.end(),
                                     [&](const auto& m) { return m.first == name; });
    for (const auto& s : program_->state) {  // a tied weight fills the slot of each of its names
      if (s.name != name) continue;
      st = &s;
      state_.emplace_back(s.slot, t);
      state_names_.push_back(name);
      constant_.push_back(s.constant);
      mutated_.push_back(mutated);
    }
    TORCH_CHECK(st != nullptr, "conveyor: ", where_, " has no parameter or buffer '", name, "'");
    if (st->constant) continue;
    const auto parts = split_name(name);
    torch::nn::Module* holder = this;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      auto children = holder->named_children();
      std::shared_ptr<torch::nn::Module> child;
      if (const auto* found = children.find(parts[i])) {
        child = *found;
      } else {
        child = holder->register_module(parts[i], std::make_shared<ExportState>());
      }
      holder = child.get();
    }
    if (st->parameter) {
      holder->register_parameter(parts.back(), t, t.requires_grad());
    } else {
      holder->register_buffer(parts.back(), t);
    }
  }
}

void ExportLayerImpl::check_inputs(const Tensors& inputs) const {
  TORCH_CHECK(inputs.size() == segment_.inputs.size(), "conveyor: ", segment_.description, " takes ",
              segment_.inputs.size(), " tensors, got ", inputs.size());
  if (segment_.first != 0) return;
  size_t i = 0;
  for (const exported::UserInput& in : program_->inputs) {
    if (!in.tensor) continue;
    const at::Tensor& t = inputs[i++];
    TORCH_CHECK(t.defined(), "conveyor: the program's input '", in.name, "' is undefined");
    if (in.static_size.empty()) continue;
    TORCH_CHECK(t.dim() == static_cast<int64_t>(in.static_size.size()), "conveyor: the program's input '", in.name,
                "' has ", in.static_size.size(), " dimensions, got a tensor of shape ", t.sizes());
    for (size_t d = 0; d < in.static_size.size(); ++d) {
      TORCH_CHECK(in.static_size[d] < 0 || in.static_size[d] == t.size(d), "conveyor: the program's input '",
                  in.name, "' was exported with size ", in.static_size[d], " in dimension ", d, ", got ", t.size(d),
                  " (shape ", t.sizes(), "): export it with that dimension dynamic (dynamic_shapes) for micro-batches "
                  "of other sizes");
    }
  }
}

Tensors ExportLayerImpl::forward(Tensors inputs) {
  check_inputs(inputs);
  std::vector<c10::IValue> values(program_->num_slots());
  c10::Device device = c10::kCPU;
  bool placed = false;
  for (size_t i = 0; i < state_.size(); ++i) {
    const at::Tensor& t = state_[i].second;
    if (!constant_[i] && !placed) {
      device = t.device();
      placed = true;
    }
  }
  if (!placed && !inputs.empty() && inputs[0].defined()) device = inputs[0].device();
  for (size_t i = 0; i < state_.size(); ++i) {
    const at::Tensor& t = state_[i].second;
    // A buffer a functional graph returns anew is read from a copy: autograd
    // may keep what the graph read, and the buffer is overwritten below.
    values[state_[i].first] = constant_[i] && t.device() != device ? t.to(device) : mutated_[i] ? t.clone() : t;
  }
  for (const exported::UserInput& in : program_->inputs) {
    if (!in.tensor) values[in.slot] = in.constant;
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const int slot = segment_.inputs[i];
    values[slot] = program_->symbolic[slot] ? exported::number_from(inputs[i]) : c10::IValue(std::move(inputs[i]));
  }
  exported::run_nodes(*program_, segment_.first, segment_.last, values,
                      exported::RunContext{device, is_training()});
  for (const auto& [buffer, slot] : program_->buffer_mutations) {
    if (!values[slot].isTensor()) continue;
    for (size_t i = 0; i < state_.size(); ++i) {
      if (state_names_[i] != buffer) continue;
      torch::NoGradGuard no_grad;
      state_[i].second.copy_(values[slot].toTensor());
    }
  }
  Tensors outputs;
  outputs.reserve(segment_.outputs.size());
  for (int slot : segment_.outputs) {
    const c10::IValue& v = values[slot];
    if (v.isTensor()) {
      outputs.push_back(v.toTensor());
    } else if (v.isInt()) {
      outputs.push_back(at::scalar_tensor(v.toInt(), at::kLong));
    } else if (v.isDouble()) {
      outputs.push_back(at::scalar_tensor(v.toDouble(), at::kDouble));
    } else if (v.isBool()) {
      outputs.push_back(at::scalar_tensor(v.toBool(), at::kBool));
    } else {
      TORCH_CHECK(false, "conveyor: ", segment_.description, " leaves '", program_->value_names[slot],
                  "' (a ", v.tagKind(), ") to the next stage, but only tensors and sizes travel between stages");
    }
  }
  return outputs;
}

void ExportLayerImpl::rebind_parameter(const std::string& name, const at::Tensor& replacement) {
  const auto parts = split_name(name);
  torch::nn::Module* holder = this;
  for (size_t i = 0; i + 1 < parts.size(); ++i) holder = holder->named_children()[parts[i]].get();
  if (auto* state = dynamic_cast<ExportState*>(holder)) {
    state->replace_parameter(parts.back(), replacement);
  } else {
    TORCH_CHECK(parameters_.contains(parts.back()), "conveyor: ", segment_.description, " holds no parameter '",
                name, "'");
    parameters_[parts.back()] = replacement;
  }
  for (size_t i = 0; i < state_.size(); ++i) {
    if (state_names_[i] == name) state_[i].second = replacement;
  }
}

std::shared_ptr<torch::nn::Module> ExportLayerImpl::clone(const std::optional<torch::Device>& device) const {
  std::map<std::string, at::Tensor> copies;
  for (size_t i = 0; i < state_.size(); ++i) {
    const at::Tensor& t = state_[i].second;
    at::Tensor c = t.detach().clone();
    if (t.requires_grad()) c.set_requires_grad(true);
    copies.emplace(state_names_[i], std::move(c));
  }
  auto copy = std::make_shared<ExportLayerImpl>(program_, segment_, copies, where_);
  copy->train(is_training());
  if (device) copy->to(*device);
  return copy;
}

void ExportLayerImpl::clone_(torch::nn::Module& other, const std::optional<torch::Device>& device) {
  auto* source = dynamic_cast<ExportLayerImpl*>(&other);
  TORCH_CHECK(source != nullptr, "conveyor: cannot make an ExportLayer a clone of a ", other.name());
  *this = *std::static_pointer_cast<ExportLayerImpl>(source->clone(device));
}

void ExportLayerImpl::pretty_print(std::ostream& stream) const {
  stream << "conveyor::ExportLayer(" << segment_.description << ", nodes " << segment_.first << ".."
         << segment_.last << ")";
}

}  // namespace conveyor
