#pragma once
// What measuring a model changes, kept and put back: its gradients, its
// buffers (batch norm's statistics), the random generators (dropout draws)
// and, when asked, its weights with the devices they were on. Profiling
// (plugin/planner/profile.cpp) runs layers forward and backward and keeps
// all but the weights, which it does not change; tuning (plugin/measure/race_candidates.h)
// trains pipelines built on the model, which move its layers to their
// stages' devices and step them, and keeps everything.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>

#include <vector>

namespace conveyor {

// The default random generators: the CPU's, then each CUDA device's.
std::vector<at::Generator> default_generators();

class ModelSnapshot {
 public:
  ModelSnapshot(const torch::nn::Sequential& model, bool weights);
  // Puts back what was kept, into the model's own tensors (an optimizer over
  // its parameters still steps them). With the weights kept, weights and
  // buffers return to the devices they were on; without, buffers are copied
  // where they are now and gradients follow their weights.
  void restore() const;

 private:
  torch::nn::Sequential model_;
  std::vector<at::Tensor> weights_, grads_, buffers_, states_;
  std::vector<at::Generator> generators_;
};

// A snapshot put back when the scope ends, however it ends.
class RestoredOnExit {
 public:
  RestoredOnExit(const torch::nn::Sequential& model, bool weights) : snapshot_(model, weights) {}
  ~RestoredOnExit() { snapshot_.restore(); }
  RestoredOnExit(const RestoredOnExit&) = delete;
  RestoredOnExit& operator=(const RestoredOnExit&) = delete;
  const ModelSnapshot& snapshot() const { return snapshot_; }

 private:
  ModelSnapshot snapshot_;
};

}  // namespace conveyor
