#include "plugin/measure/profile_model.h"

#include "plugin/core/errors.h"
#include "plugin/model/microbatches.h"
#include "plugin/runner/stage_runner.h"
#include "plugin/planner/planner.h"
#include "plugin/support/timing.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/linear.h>

#include <stdexcept>

namespace conveyor {

namespace {

// The measuring models' initialisation and data draw from the global
// generator: put it back, so that profiling leaves the caller's random
// stream where it was.
struct KeepRandomStream {
  at::Tensor state = at::detail::getDefaultCPUGenerator().get_state();
  ~KeepRandomStream() {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(state);
  }
};

}  // namespace

ModelProfile profile_model(const torch::nn::Sequential& model, const Tensors& inputs, const Tensors& targets,
                           const TensorsLossFn& loss_fn, const ProfileOptions& options) {
  ModelProfile profile = profile_layers(model, inputs, targets, loss_fn, options);
  if (options.action_overhead()) {
    profile.action_overhead_seconds = measure_action_overhead(c10::Device(options.device()));
    if (!profile.slowdown.empty()) profile.crowded_action_overhead_seconds = measure_crowded_overhead(profile);
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

ModelProfile profile_first_microbatch(const torch::nn::Sequential& model, const Tensors& inputs,
                                      const Tensors& targets, const TensorsLossFn& loss_fn,
                                      const PipelineOptions& options, ProfileOptions profiling) {
  const auto first = [&](const Tensors& batch, const char* what, const std::vector<int64_t>& shared) {
    std::vector<Tensors> parts;
    split_microbatches(batch, what, shared, options.batch_dim(), options.microbatches(), parts);
    return parts.at(0);
  };
  profiling.batch_dim(options.batch_dim());
  if (!profiling.optimizer()) profiling.optimizer(optimizer_factory(options));
  return profile_model(model, first(inputs, "input", options.shared_inputs()),
                       first(targets, "target", options.shared_targets()), loss_fn, profiling);
}

ModelProfile profile_first_microbatch(const torch::nn::Sequential& model, const at::Tensor& input,
                                      const at::Tensor& target, const LossFn& loss_fn, const PipelineOptions& options,
                                      ProfileOptions profiling) {
  if (!loss_fn) throw std::invalid_argument("conveyor: profile_first_microbatch: no loss function given");
  return profile_first_microbatch(
      model, Tensors{input}, Tensors{target},
      [loss_fn](const Tensors& out, const Tensors& t) { return loss_fn(out.at(0), t.at(0)); }, options,
      std::move(profiling));
}

double measure_action_overhead(const c10::Device& device) {
  constexpr int kStages = 2, kMicrobatches = 8;
  KeepRandomStream keep_random_stream;
  torch::nn::Sequential idle(torch::nn::Linear(1, 1), torch::nn::Linear(1, 1));  // as little work as a layer does
  StageRunner pipe(idle, PipelineOptions()
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

double measure_crowded_overhead(const ModelProfile& profile) {
  check_argument(profile.cores > 0 && !profile.slowdown.empty(),
                 "conveyor: measure_crowded_overhead: the profile has no cores and slowdown measured");
  const int workers = profile.cores + 2, microbatches = 8;
  constexpr int64_t kWidth = 256, kSamples = 32;  // about 0.1 ms a layer's forward on a 2020s core
  KeepRandomStream keep_random_stream;
  torch::nn::Sequential model;
  for (int i = 0; i < 2 * workers; ++i) model->push_back(torch::nn::Linear(kWidth, kWidth));
  const at::Tensor x = at::randn({kSamples * microbatches, kWidth}), y = at::randn({kSamples * microbatches, kWidth});
  const LossFn loss = [](const at::Tensor& out, const at::Tensor& target) { return (out - target).pow(2).mean(); };
  const auto options = [&](const std::shared_ptr<ModelProfile>& p) {  // split by time, as the planner does
    return PipelineOptions().workers(workers).microbatches(microbatches).schedule("1f1b").profile(p).balance(
        Balance::kTime).divergence_guard(false);
  };
  // This model's layers, priced with the machine's own slowdown and overhead.
  auto own = std::make_shared<ModelProfile>(profile_model(
      model, x.narrow(0, 0, kSamples), y.narrow(0, 0, kSamples), loss, ProfileOptions().action_overhead(false)));
  own->cores = profile.cores;
  own->slowdown = profile.slowdown;
  own->action_overhead_seconds = profile.action_overhead_seconds;
  const Prediction plan = predict_step(model, options(own), x.size(0));
  StageRunner pipe(model, options(own));
  std::vector<double> walls;
  for (int step = 0; step < 7; ++step) {
    const StepResult r = pipe.train_step(x, y, loss);
    if (step > 1) walls.push_back(r.wall_seconds);
  }
  // The prediction grows with the overhead: find the overhead that meets the step.
  const double base = plan.step_seconds(), more = 1e-3;
  own->action_overhead_seconds += more;
  const double slope = (predict_step(model, options(own), x.size(0)).step_seconds() - base) / more;
  const double extra = slope > 0 ? (median(walls) - base) / slope : 0.0;
  return profile.action_overhead_seconds + std::max(0.0, extra);
}

}  // namespace conveyor
