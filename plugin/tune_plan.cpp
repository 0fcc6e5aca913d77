#include "plugin/tune_plan.h"

#include "plugin/errors.h"
#include "plugin/pipeline.h"
#include "plugin/support/timing.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <torch/cuda.h>

#include <algorithm>
#include <iomanip>
#include <mutex>
#include <numeric>
#include <set>
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

std::vector<size_t> tune_candidates(const PlanSearch& search, const TuneOptions& tune) {
  if (search.ranked.empty()) return {};
  const double limit = search.best().plan.step_seconds() * tune.within();
  size_t eligible = 0;
  while (eligible < search.ranked.size() && search.ranked[eligible].plan.step_seconds() <= limit) ++eligible;
  eligible = std::max<size_t>(eligible, 1);
  const size_t wanted = std::min(eligible, static_cast<size_t>(tune.finalists()));
  const auto schedule_of = [&](size_t i) { return search.ranked[i].plan.schedule.name; };
  const auto shape_of = [&](size_t i) {
    return std::pair{search.ranked[i].workers, search.ranked[i].plan.schedule.num_microbatches};
  };
  std::vector<bool> picked(eligible, false);
  std::set<std::string> schedules;
  std::set<std::pair<int, int>> shapes;
  size_t count = 0;
  const auto pick = [&](size_t i) {
    picked[i] = true, ++count;
    schedules.insert(schedule_of(i));
    shapes.insert(shape_of(i));
  };
  for (size_t i = 0; i < eligible && count < wanted && i < static_cast<size_t>(tune.leaders()); ++i) pick(i);
  // Taking turns: a new schedule, then a new shape, while either is left.
  bool progress = true;
  while (count < wanted && progress) {
    progress = false;
    for (int turn = 0; turn < 2 && count < wanted; ++turn) {
      for (size_t i = 0; i < eligible; ++i) {
        const bool fresh = turn == 0 ? !schedules.count(schedule_of(i)) : !shapes.count(shape_of(i));
        if (!picked[i] && fresh) {
          pick(i);
          progress = true;
          break;
        }
      }
    }
  }
  for (size_t i = 0; i < eligible && count < wanted; ++i) {
    if (!picked[i]) pick(i);
  }
  std::vector<size_t> out;
  for (size_t i = 0; i < eligible; ++i) {
    if (picked[i]) out.push_back(i);
  }
  return out;
}

double TunedPlan::measured_seconds() const { return error.empty() ? median(step_seconds) : 0.0; }

std::string PlanTuning::str() const {
  std::ostringstream os;
  os << std::fixed << std::setprecision(2) << "raced " << finalists.size() << " plans over " << rounds
     << (rounds == 1 ? " round" : " rounds") << " (the slower half dropped after each); chose the fastest measured:\n";
  for (size_t i = 0; i < finalists.size(); ++i) {
    const TunedPlan& f = finalists[i];
    os << (i == best_index ? "  * " : "    ") << f.choice.describe() << ": predicted " << f.predicted_seconds * 1e3
       << " ms";
    if (f.error.empty()) {
      os << ", measured " << f.measured_seconds() * 1e3 << " ms (median of " << f.step_seconds.size() << ", "
         << f.rounds << (f.rounds == 1 ? " round" : " rounds") << ")\n";
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
  check_argument(tune.finalists() >= 1 && tune.steps() >= 1 && tune.rounds() >= 0 && tune.leaders() >= 0 &&
                     tune.within() >= 1,
                 "conveyor: tune_plan: finalists and steps must be positive, leaders and rounds non-negative and "
                 "within at least 1, got ",
                 tune.finalists(), ", ", tune.steps(), ", ", tune.leaders(), ", ", tune.rounds(), " and ",
                 tune.within());
  check_argument(static_cast<bool>(loss_fn), "conveyor: tune_plan: no loss function given");
  PlanTuning tuning;
  for (size_t i : tune_candidates(search, tune)) {
    const PlanChoice& c = search.ranked[i];
    tuning.finalists.push_back(TunedPlan{c, c.plan.step_seconds(), {}, "", 0});
  }
  const KeptModel kept(model);
  std::vector<size_t> alive(tuning.finalists.size());
  std::iota(alive.begin(), alive.end(), size_t{0});
  const auto faster = [&](size_t a, size_t b) {
    return tuning.finalists[a].measured_seconds() < tuning.finalists[b].measured_seconds();
  };
  do {
    const bool backwards = tuning.rounds % 2 == 1;
    for (size_t k = 0; k < alive.size(); ++k) {
      TunedPlan& f = tuning.finalists[alive[backwards ? alive.size() - 1 - k : k]];
      try {
        run_round(model, options, inputs, targets, loss_fn, tune.steps(), f);
      } catch (const std::exception& e) {
        f.error = e.what();
        f.step_seconds.clear();
      }
      ++f.rounds;
      kept.restore();
    }
    ++tuning.rounds;
    alive.erase(std::remove_if(alive.begin(), alive.end(), [&](size_t i) { return !tuning.finalists[i].error.empty(); }),
                alive.end());
    std::stable_sort(alive.begin(), alive.end(), faster);
    if (alive.size() > 1 && (tune.rounds() == 0 || tuning.rounds < tune.rounds())) alive.resize((alive.size() + 1) / 2);
  } while (alive.size() > 1 && (tune.rounds() == 0 || tuning.rounds < tune.rounds()));
  if (alive.empty()) {
    throw std::runtime_error("conveyor: tune_plan: every finalist failed; the first, " +
                             tuning.finalists.front().choice.describe() + ": " + tuning.finalists.front().error);
  }
  tuning.best_index = alive.front();
  return tuning;
}

}  // namespace conveyor
