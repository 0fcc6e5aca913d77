#include "plugin/tune_plan.h"

#include "plugin/errors.h"
#include "plugin/pipeline.h"
#include "plugin/support/timing.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <torch/cuda.h>

#include <iomanip>
#include <limits>
#include <mutex>
#include <sstream>
#include <stdexcept>

namespace conveyor {

namespace {

// What training the finalists changes and tuning puts back: each weight's and
// buffer's values and device (the pipelines move layers to their stages'
// devices; an optimizer of theirs steps), the gradients, and the random
// generators (dropout draws).
class KeptModel {
 public:
  explicit KeptModel(const torch::nn::Sequential& model) : model_(model) {
    for (const auto& p : model->parameters()) {
      weights_.push_back(p.detach().clone());
      grads_.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
    }
    for (const auto& b : model->buffers()) buffers_.push_back(b.defined() ? b.detach().clone() : at::Tensor());
    generators_.push_back(at::detail::getDefaultCPUGenerator());
    if (torch::cuda::is_available()) {
      for (c10::DeviceIndex i = 0; i < static_cast<c10::DeviceIndex>(torch::cuda::device_count()); ++i) {
        generators_.push_back(at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, i)));
      }
    }
    for (auto& g : generators_) {
      std::lock_guard<std::mutex> lock(g.mutex());
      states_.push_back(g.get_state());
    }
  }
  // The values as they were, on the devices they were on; the same tensors
  // (an optimizer the caller holds over the model's parameters still steps them).
  void restore() const {
    torch::NoGradGuard no_grad;
    const auto params = model_->parameters();
    for (size_t i = 0; i < params.size() && i < weights_.size(); ++i) {
      at::Tensor p = params[i];
      p.set_data(weights_[i].clone());
      p.mutable_grad() = grads_[i].defined() ? grads_[i].clone() : at::Tensor();
    }
    const auto buffers = model_->buffers();
    for (size_t i = 0; i < buffers.size() && i < buffers_.size(); ++i) {
      at::Tensor b = buffers[i];
      if (buffers_[i].defined()) b.set_data(buffers_[i].clone());
    }
    for (size_t i = 0; i < generators_.size(); ++i) {
      at::Generator g = generators_[i];
      std::lock_guard<std::mutex> lock(g.mutex());
      g.set_state(states_[i]);
    }
  }

 private:
  torch::nn::Sequential model_;
  std::vector<at::Tensor> weights_, grads_, buffers_, states_;
  std::vector<at::Generator> generators_;
};

// One round of a finalist: build, warm up, time `steps` steps.
void run_round(const torch::nn::Sequential& model, const PipelineOptions& options, const Tensors& inputs,
               const Tensors& targets, const TensorsLossFn& loss_fn, int steps, TunedPlan& finalist) {
  Pipeline pipe(model, finalist.choice.options(options));
  const auto clear = [&] {
    for (const auto& p : pipe.parameters()) p.mutable_grad() = at::Tensor();
  };
  pipe.train_step(inputs, targets, loss_fn);
  clear();
  for (int s = 0; s < steps; ++s) {
    finalist.step_seconds.push_back(pipe.train_step(inputs, targets, loss_fn).wall_seconds);
    clear();
  }
}

}  // namespace

double TunedPlan::measured_seconds() const { return error.empty() ? median(step_seconds) : 0.0; }

std::string PlanTuning::str() const {
  std::ostringstream os;
  os << std::fixed << std::setprecision(2) << "measured the " << finalists.size()
     << " plans predicted fastest; chose the fastest measured:\n";
  for (size_t i = 0; i < finalists.size(); ++i) {
    const TunedPlan& f = finalists[i];
    os << (i == best_index ? "  * " : "    ") << f.choice.describe() << ": predicted " << f.predicted_seconds * 1e3
       << " ms";
    if (f.error.empty()) {
      os << ", measured " << f.measured_seconds() * 1e3 << " ms (median of " << f.step_seconds.size() << ")\n";
    } else {
      os << ", failed: " << f.error << "\n";
    }
  }
  return os.str();
}

PlanTuning tune_plan(const torch::nn::Sequential& model, const PlanSearch& search, const PipelineOptions& options,
                     const Tensors& inputs, const Tensors& targets, const TensorsLossFn& loss_fn,
                     const TuneOptions& tune) {
  check_argument(!search.ranked.empty(), "conveyor: tune_plan: the search found no plan to measure");
  check_argument(tune.finalists() >= 1 && tune.steps() >= 1 && tune.rounds() >= 1,
                 "conveyor: tune_plan: finalists, steps and rounds must be positive, got ", tune.finalists(), ", ",
                 tune.steps(), " and ", tune.rounds());
  check_argument(static_cast<bool>(loss_fn), "conveyor: tune_plan: no loss function given");
  PlanTuning tuning;
  const size_t count = std::min(search.ranked.size(), static_cast<size_t>(tune.finalists()));
  for (size_t i = 0; i < count; ++i) {
    const PlanChoice& c = search.ranked[i];
    tuning.finalists.push_back(TunedPlan{c, c.plan.step_seconds(), {}, ""});
  }
  const KeptModel kept(model);
  for (int r = 0; r < tune.rounds(); ++r) {
    for (size_t k = 0; k < count; ++k) {
      TunedPlan& f = tuning.finalists[r % 2 == 0 ? k : count - 1 - k];
      if (!f.error.empty()) continue;
      try {
        run_round(model, options, inputs, targets, loss_fn, tune.steps(), f);
      } catch (const std::exception& e) {
        f.error = e.what();
        f.step_seconds.clear();
      }
      kept.restore();
    }
  }
  double fastest = std::numeric_limits<double>::infinity();
  bool any = false;
  for (size_t i = 0; i < count; ++i) {
    const TunedPlan& f = tuning.finalists[i];
    if (!f.error.empty()) continue;
    any = true;
    if (f.measured_seconds() < fastest) fastest = f.measured_seconds(), tuning.best_index = i;
  }
  if (!any) {
    throw std::runtime_error("conveyor: tune_plan: every finalist failed; the first, " +
                             tuning.finalists.front().choice.describe() + ": " + tuning.finalists.front().error);
  }
  return tuning;
}

}  // namespace conveyor
