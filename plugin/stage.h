#pragma once
// Stage: a contiguous slice of a Sequential's layers placed on one device. It
// shares the layer modules with the user's model (nothing is copied), and runs
// them one by one so that a failure names the layer that raised it.

#include <c10/core/Device.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

#include <string>
#include <utility>
#include <vector>

namespace conveyor {

class Stage {
 public:
  // `layers` are (name in the original Sequential, module); `first_layer` is
  // the index of layers[0] there. Moves the layers to `device`.
  Stage(int index, std::vector<std::pair<std::string, torch::nn::AnyModule>> layers, int64_t first_layer,
        c10::Device device);

  // Runs the layers in order. A failing layer is reported as
  // "layer 2 (torch::nn::Linear(...)): <what it said>"; the runtime adds the
  // stage, micro-batch and action.
  at::Tensor forward(const at::Tensor& input) const;

  int index() const { return index_; }
  const c10::Device& device() const { return device_; }
  int64_t first_layer() const { return first_layer_; }
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

  // The layers as a Sequential (same module objects, original names).
  torch::nn::Sequential module() const { return module_; }

 private:
  int index_;
  int64_t first_layer_;
  c10::Device device_;
  std::vector<std::pair<std::string, torch::nn::AnyModule>> layers_;
  torch::nn::Sequential module_;
};

}  // namespace conveyor
