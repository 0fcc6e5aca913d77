#pragma once
// The planner tests' model: six layers of uneven cost, with activations that
// dominate memory, and its profile.

#include "plugin/planner/profile.h"

#include <torch/torch.h>

#include <memory>
#include <string>

namespace conveyor {

// Six layers of uneven cost, with activations that dominate memory, measured
// (as if) at 4 samples per micro-batch.
inline std::shared_ptr<ModelProfile> six_layer_profile() {
  auto p = std::make_shared<ModelProfile>();
  p->device = "cpu";
  p->batch_size = 4;
  p->input_bytes = 4 * 64 * 4;
  p->loss_forward_seconds = 0.0002;
  p->loss_backward_seconds = 0.0002;
  p->action_overhead_seconds = 0.00005;
  p->link = LinkProfile{"in-process handoff (same device)", 0.00002, 0};
  const double seconds[] = {0.004, 0.001, 0.003, 0.002, 0.005, 0.001};
  for (int i = 0; i < 6; ++i) {
    LayerProfile l;
    l.name = std::to_string(i) + " torch::nn::Linear";
    l.forward_seconds = seconds[i];
    l.backward_seconds = 2 * seconds[i];
    l.forward_fixed = 0.0001;
    l.backward_fixed = 0.0001;
    l.output_bytes = l.output_grad_bytes = 4 * 4096;
    l.parameter_bytes = 64 * 64 * 4;
    p->layers.push_back(l);
  }
  return p;
}

inline torch::nn::Sequential six_layers() {
  torch::nn::Sequential m;
  for (int i = 0; i < 6; ++i) m->push_back(torch::nn::Linear(64, 64));
  return m;
}

}  // namespace conveyor
