#pragma once
// The names the original model gives a pipeline's parameters and buffers.
// A stage's layers are named as in the Sequential the pipeline was made from
// ("3.weight"), unless a layer says it stands for a part of another model: a
// ScriptLayer answers with its TorchScript path ("encoder.layer2.weight").
// Checkpoints and the Python class use these names, so a state dict moves
// between the pipeline and the unsplit model.

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace conveyor {

class Stage;

// Implemented by a layer whose tensors the original model names under a path
// of its own rather than under the layer's name in the Sequential.
class ModelPath {
 public:
  virtual ~ModelPath() = default;
  // The dotted path of the layer's tensors in the original model; empty: at its top.
  virtual std::string model_path() const = 0;
};

// One stage's, by the model's names (a whole pipeline's: plugin/runner/stage_runner.h).
std::vector<std::pair<std::string, at::Tensor>> model_named_parameters(const Stage& stage);
std::vector<std::pair<std::string, at::Tensor>> model_named_buffers(const Stage& stage);

}  // namespace conveyor
