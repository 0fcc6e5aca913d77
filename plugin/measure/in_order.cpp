#include "plugin/measure/in_order.h"

#include "plugin/measure/device_timing.h"

#include <torch/csrc/autograd/autograd.h>

namespace conveyor::measure_detail {

void whole_step(const std::vector<std::shared_ptr<Stage>>& layers, const Tensors& inputs, const Tensors& targets,
                const TensorsLossFn& loss_fn) {
  Tensors x = inputs;
  std::vector<at::Tensor> weights;
  for (const auto& layer : layers) {
    x = layer->forward(x);
    for (const auto& w : layer->layer_parameters(0)) {
      if (w.requires_grad()) weights.push_back(w);
    }
  }
  const at::Tensor value = loss_fn(x, targets);
  if (value.requires_grad() && !weights.empty()) {
    torch::autograd::grad({value}, weights, {}, /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
  }
}

InOrderTimes time_in_order(const std::vector<std::shared_ptr<Stage>>& layers, const Tensors& inputs,
                           const Tensors& targets, const TensorsLossFn& loss_fn, const c10::Device& device, int warmup,
                           int repeats) {
  std::vector<std::vector<double>> forward(layers.size());
  std::vector<double> backward;
  for (int r = 0; r < warmup + repeats; ++r) {
    Tensors x = inputs;
    for (size_t i = 0; i < layers.size(); ++i) {
      const double t = seconds_of(device, [&] { x = layers[i]->forward(x); });
      if (r >= warmup) forward[i].push_back(t);
    }
    const at::Tensor value = loss_fn(x, targets);
    const double t = value.requires_grad() ? seconds_of(device, [&] { value.backward(); }) : 0.0;
    if (r >= warmup) backward.push_back(t);
  }
  InOrderTimes times;
  for (auto& f : forward) times.forward.push_back(median(f));
  times.backward = median(backward);
  return times;
}

}  // namespace conveyor::measure_detail
