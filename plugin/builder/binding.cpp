#include "plugin/builder/binding.h"

#include "plugin/checkpoint/checkpoint.h"
#include "plugin/checkpoint/model_state.h"
#include "plugin/core/option_values.h"

#include <ATen/core/ivalue_inl.h>

#include <utility>

namespace conveyor {

namespace {

c10::Dict<std::string, at::Tensor> as_dict(const std::vector<std::pair<std::string, at::Tensor>>& named) {
  c10::Dict<std::string, at::Tensor> out;
  for (const auto& [name, t] : named) out.insert(name, t);
  return out;
}

}  // namespace

double PipelineBinding::train_step(const c10::IValue& input, const c10::IValue& target) {
  return pipe_->train_step(as_tensors("input", input), as_tensors("target", target)).loss;
}

c10::Dict<std::string, double> PipelineBinding::last_step() const {
  const StepResult& last = pipe_->last_step();
  c10::Dict<std::string, double> out;
  out.insert("loss", last.loss);
  out.insert("grad_norm", last.grad_norm);
  out.insert("loss_scale", last.loss_scale);
  out.insert("skipped_updates", static_cast<double>(last.skipped_updates));
  out.insert("stepped", last.stepped ? 1.0 : 0.0);
  return out;
}

double PipelineBinding::clip_grad_norm(double max_norm, double norm_type) {
  return pipe_->clip_grad_norm(max_norm, norm_type);
}

c10::IValue PipelineBinding::forward(const c10::IValue& input) {
  const Tensors out = pipe_->forward(as_tensors("input", input));
  if (out.size() == 1) return out[0];
  std::vector<c10::IValue> items(out.begin(), out.end());
  return c10::ivalue::Tuple::create(std::move(items));
}

c10::Dict<std::string, at::Tensor> PipelineBinding::named_parameters() const {
  return as_dict(pipe_->named_parameters());
}

c10::Dict<std::string, at::Tensor> PipelineBinding::state_dict() const { return as_dict(pipe_->state_dict()); }

void PipelineBinding::load_state_dict(const c10::Dict<std::string, at::Tensor>& state) {
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& entry : state) named.emplace_back(entry.key(), entry.value());
  pipe_->load_state_dict(named);
}

void PipelineBinding::save_checkpoint(const std::string& path, int64_t step) const {
  conveyor::save_checkpoint(path, *pipe_, TrainingState{step, {}});
}

int64_t PipelineBinding::load_checkpoint(const std::string& path) { return conveyor::load_checkpoint(path, *pipe_); }

void PipelineBinding::save_model_state(const std::string& path) const { conveyor::save_model_state(path, *pipe_); }

}  // namespace conveyor
