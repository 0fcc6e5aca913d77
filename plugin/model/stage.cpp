#include "plugin/model/stage.h"

#include "plugin/core/errors.h"
#include "plugin/model/sharded_state.h"

#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <sstream>
#include <stdexcept>
#include <unordered_set>

namespace conveyor {

int64_t WeightVersion::bytes() const {
  int64_t total = 0;
  for (const auto& t : tensors) total += static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
  return total;
}

Stage::Stage(int index, std::vector<std::pair<std::string, torch::nn::AnyModule>> layers, int64_t first_layer,
             c10::Device device)
    : index_(index), first_layer_(first_layer), device_(device), layers_(std::move(layers)) {
  for (auto& [name, layer] : layers_) {
    layer.ptr()->to(device_);
    module_->push_back(name, layer);
    tensors_layers_.push_back(dynamic_cast<TensorsLayer*>(layer.ptr().get()));
  }
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& p : module_->named_parameters()) {
    if (!seen.insert(p.value().unsafeGetTensorImpl()).second) continue;
    names_.push_back(p.key());
    params_.push_back(p.value());
  }
  live_ = params_;
  std::unordered_set<const c10::TensorImpl*> in_some_layer;
  for (auto& [name, layer] : layers_) {
    std::unordered_set<const c10::TensorImpl*> mine;
    auto& list = layer_params_.emplace_back();
    for (const auto& p : layer.ptr()->parameters()) {
      if (!p.requires_grad() || !mine.insert(p.unsafeGetTensorImpl()).second) continue;
      list.push_back(p);
      if (!in_some_layer.insert(p.unsafeGetTensorImpl()).second) shared_across_layers_ = true;
    }
  }
}

Tensors Stage::forward(Tensors x) const { return forward(std::move(x), nullptr); }

Tensors Stage::forward(Tensors x, std::vector<Tensors>* outputs) const {
  if (outputs) outputs->clear();
  for (size_t i = 0; i < layers_.size(); ++i) {
    const std::string& name = layers_[i].first;
    torch::nn::AnyModule layer = layers_[i].second;  // forward() is non-const; the copy shares the module
    try {
      if (TensorsLayer* list_layer = tensors_layers_[i]) {
        const int64_t want = list_layer->num_inputs();
        if (want >= 0 && want != static_cast<int64_t>(x.size())) {
          throw std::invalid_argument(
              c10::str("it takes ", want, " tensor", want == 1 ? "" : "s", ", but ", x.size(), " reach it"));
        }
        x = list_layer->forward(std::move(x));
      } else {
        if (x.size() != 1) {
          throw std::invalid_argument(c10::str("it takes one tensor, but ", x.size(),
                                               " reach it (make it a conveyor::TensorsLayer, or wrap it in ",
                                               "conveyor::OnSlot)"));
        }
        x[0] = layer.forward<at::Tensor>(x[0]);
      }
    } catch (const std::exception& e) {
      std::ostringstream os;
      os << "layer " << name << " (";
      layer.ptr()->pretty_print(os);
      os << "): ";
      os << message_of(e);
      throw std::runtime_error(os.str());
    }
    if (outputs) outputs->push_back(x);
  }
  return x;
}

void Stage::separate_live_weights() {
  if (separate_) return;
  TORCH_CHECK(optimizer_ == nullptr, "conveyor: stage ", index_,
              ": separate the live weights before the optimizer is made");
  live_.clear();
  for (const auto& p : params_) live_.push_back(p.detach().clone().requires_grad_(p.requires_grad()));
  separate_ = true;
  read_live_weights();
}

std::shared_ptr<WeightVersion> Stage::snapshot() const {
  auto version = std::make_shared<WeightVersion>();
  for (const auto& w : live_) version->tensors.push_back(w.detach().clone());
  return version;
}

void Stage::read_weights(const WeightVersion& version) {
  for (size_t i = 0; i < params_.size(); ++i) params_[i].set_data(version.tensors[i]);
}

void Stage::read_live_weights() {
  if (!separate_) return;
  for (size_t i = 0; i < params_.size(); ++i) params_[i].set_data(live_[i].detach());
}

void Stage::collect_gradients() {
  if (!separate_) return;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor g = params_[i].grad();
    if (!g.defined()) continue;
    at::Tensor& target = live_[i].mutable_grad();
    target = target.defined() ? target + g : g;
    params_[i].mutable_grad() = at::Tensor();
  }
}

ShardedState* Stage::parameter_shards() const {
  auto* sharded = dynamic_cast<ShardedState*>(optimizer_.get());
  return sharded && sharded->shards_parameters() ? sharded : nullptr;
}

const std::vector<at::Tensor>& Stage::gradient_holders() const {
  if (const auto* sharded = dynamic_cast<const ShardedState*>(optimizer_.get())) {
    if (const std::vector<at::Tensor>* pieces = sharded->gradient_pieces()) return *pieces;
  }
  return live_;
}

namespace {

std::vector<at::Tensor> defined_gradients(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> grads;
  for (const auto& t : tensors) {
    if (t.grad().defined()) grads.push_back(t.grad());
  }
  return grads;
}

}  // namespace

std::vector<at::Tensor> Stage::gradients() const { return defined_gradients(gradient_holders()); }

std::vector<at::Tensor> Stage::made_gradients() const { return defined_gradients(live_); }

void Stage::clear_gradients() {
  for (auto& p : params_) p.mutable_grad() = at::Tensor();
  for (auto& w : live_) w.mutable_grad() = at::Tensor();
  for (const auto& h : gradient_holders()) h.mutable_grad() = at::Tensor();
}

void Stage::restore_live(const WeightVersion& version) {
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < live_.size(); ++i) live_[i].copy_(version.tensors[i]);
  read_live_weights();
}

void Stage::step(double lr) {
  TORCH_CHECK(optimizer_ != nullptr, "conveyor: stage ", index_, " has no optimizer to step");
  if (lr >= 0) {
    for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
  }
  optimizer_->step();
  optimizer_->zero_grad(/*set_to_none=*/true);
  ++updates_;
}

void Stage::skip_step() {
  clear_gradients();
  ++updates_;
}

void Stage::without_buffer_changes(const std::function<void()>& replay) const {
  const std::vector<at::Tensor> buffers = module_->buffers();
  std::vector<at::Tensor> saved;
  {
    c10::NoGradGuard no_grad;
    for (const at::Tensor& b : buffers) saved.push_back(b.defined() ? b.clone() : b);
  }
  replay();
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < saved.size(); ++i) {
    if (saved[i].defined()) buffers[i].variable_data().copy_(saved[i]);
  }
}

}  // namespace conveyor
