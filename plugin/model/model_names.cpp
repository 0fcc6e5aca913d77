#include "plugin/model/model_names.h"

#include "plugin/model/stage.h"

namespace conveyor {

namespace {

template <typename Select>
std::vector<std::pair<std::string, at::Tensor>> stage_named(const Stage& stage, Select select) {
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& layer : stage.module()->named_children()) {
    std::string prefix = layer.key();
    if (const auto* path = dynamic_cast<const ModelPath*>(layer.value().get())) prefix = path->model_path();
    for (const auto& item : select(*layer.value())) {
      named.emplace_back(prefix.empty() ? item.key() : prefix + "." + item.key(), item.value());
    }
  }
  return named;
}

const auto kParameters = [](const torch::nn::Module& m) { return m.named_parameters(); };
const auto kBuffers = [](const torch::nn::Module& m) { return m.named_buffers(); };

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> model_named_parameters(const Stage& stage) {
  return stage_named(stage, kParameters);
}

std::vector<std::pair<std::string, at::Tensor>> model_named_buffers(const Stage& stage) {
  return stage_named(stage, kBuffers);
}

}  // namespace conveyor
