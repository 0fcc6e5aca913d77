#include "plugin/profile_model.h"

#include "plugin/pipeline.h"
#include "plugin/support/timing.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/linear.h>

#include <stdexcept>

namespace conveyor {

ModelProfile profile_model(const torch::nn::Sequential& model, const Tensors& inputs, const Tensors& targets,
                           const TensorsLossFn& loss_fn, const ProfileOptions& options) {
  ModelProfile profile = profile_layers(model, inputs, targets, loss_fn, options);
  if (options.action_overhead()) {
    profile.action_overhead_seconds = measure_action_overhead(c10::Device(options.device()));
  }
  return profile;
}

ModelProfile profile_model(const torch::nn::Sequential& model, const at::Tensor& input, const at::Tensor& target,
                           const LossFn& loss_fn, const ProfileOptions& options) {
  if (!loss_fn) throw std::invalid_argument("conveyor: profile_model: no loss function given");
  return profile_model(model, Tensors{input}, Tensors{target},
                       [loss_fn](const Tensors& out, const Tensors& t) { return loss_fn(out.at(0), t.at(0)); },
                       options);
}

double measure_action_overhead(const c10::Device& device) {
  constexpr int kStages = 2, kMicrobatches = 8;
  // Its layers' initialisation draws from the global generator: put it back,
  // so that profiling leaves the caller's random stream where it was.
  struct KeepRandomStream {
    at::Tensor state = at::detail::getDefaultCPUGenerator().get_state();
    ~KeepRandomStream() {
      at::Generator generator = at::detail::getDefaultCPUGenerator();
      generator.set_state(state);
    }
  } keep_random_stream;
  torch::nn::Sequential idle(torch::nn::Linear(1, 1), torch::nn::Linear(1, 1));  // as little work as a layer does
  Pipeline pipe(idle, PipelineOptions()
                          .workers(kStages)
                          .microbatches(kMicrobatches)
                          .schedule("gpipe")
                          .devices({device.str()})
                          .divergence_guard(false));
  const at::Tensor x = at::zeros({kMicrobatches, 1}, at::TensorOptions().device(device));
  const LossFn loss = [](const at::Tensor& out, const at::Tensor&) { return out.sum(); };
  std::vector<double> walls;
  for (int step = 0; step < 7; ++step) {
    const StepResult r = pipe.train_step(x, x, loss);
    if (step > 1) walls.push_back(r.wall_seconds);
  }
  return median(walls) / (2.0 * (kMicrobatches + kStages - 1));
}

}  // namespace conveyor
