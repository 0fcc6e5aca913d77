#include "examples/common/planning.h"

#include <torch/torch.h>

#include <stdexcept>

namespace conveyor::examples {

const std::vector<std::string>& balance_names() {
  static const std::vector<std::string> names = {"time", "uniform", "flops"};
  return names;
}

void apply_balance(const std::string& balance, const std::vector<double>& estimate, int stages,
                   PipelineOptions& options) {
  if (balance == "time") {
    options.balance(Balance::kTime);
  } else if (balance == "uniform") {
    options.balance(Balance::kUniform);
  } else if (balance == "flops") {
    options.boundaries(balanced_boundaries(estimate, stages));
  } else {
    throw std::invalid_argument("--balance expects time, uniform or flops, got '" + balance + "'");
  }
}

PipelineOptions plan_options(const std::string& plan, const torch::nn::Sequential& model, int64_t batch,
                             int max_workers, int64_t memory_budget_mib, PipelineOptions options, std::ostream& out,
                             const TuningBatch* tuning) {
  if (plan == "given") return options;
  if (plan != "auto" && plan != "tuned") {
    throw std::invalid_argument("--plan expects given, auto or tuned, got '" + plan + "'");
  }
  if (plan == "tuned" && !tuning) throw std::invalid_argument("--plan tuned is not available here: use auto");
  if (!schedules::make_schedule(options.schedule(), 1, 1).synchronous()) {
    throw std::invalid_argument("--plan " + plan + " searches the synchronous schedules: leave out --schedule " +
                                options.schedule());
  }
  PlanSpace space;
  space.max_workers = max_workers;
  space.memory_budget = memory_budget_mib << 20;
  const PlanSearch search = search_plans(model, options, batch, space);
  out << "--plan " << plan << ": " << search.str();
  if (plan == "auto") return search.best().options(std::move(options));
  const PlanTuning tuned = tune_plan(model, search, options, tuning->inputs, tuning->targets, tuning->loss);
  out << "--plan tuned: " << tuned.str();
  return tuned.best().options(std::move(options));
}

void report_step(std::ostream& out, const Plan& plan, const StepResult& step, const std::string& timeline) {
  out << "  " << plan.versus(step);
  if (!timeline.empty()) {
    plan.write_timeline(timeline, &step);
    out << "  timeline of the last step, predicted above measured: " << timeline << "\n";
  }
}

}  // namespace conveyor::examples
