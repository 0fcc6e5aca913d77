#include "plugin/builder/plan.h"

#include "plugin/core/errors.h"
#include "plugin/planner/search.h"
#include "plugin/measure/profile_model.h"
#include "plugin/measure/race_candidates.h"
#include "schedules/generators.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <stdexcept>

namespace conveyor {

int64_t batch_size(const SampleBatch& sample, const PipelineOptions& options) {
  const auto& shared = options.shared_inputs();
  for (size_t i = 0; i < sample.inputs.size(); ++i) {
    const at::Tensor& t = sample.inputs[i];
    const bool whole = std::find(shared.begin(), shared.end(), static_cast<int64_t>(i)) != shared.end();
    if (t.defined() && !whole && t.dim() > options.batch_dim()) return t.size(options.batch_dim());
  }
  return 0;
}

namespace {
std::atomic<int64_t> request_counters[4];  // by RequestStage
}  // namespace

void count_request(RequestStage stage) { request_counters[static_cast<int>(stage)]++; }

RequestCounts request_counts() {
  return {request_counters[0].load(), request_counters[1].load(), request_counters[2].load(),
          request_counters[3].load()};
}

void check_plan_mode(const PipelineOptions& options, const PlanInputs& inputs) {
  count_request(RequestStage::kPlanCheck);
  const PlanMode mode = options.plan();
  const char* name = value_name(mode);
  if (mode == PlanMode::kGiven) {
    check_argument(options.max_workers() == 0 && options.memory_budget() == 0,
                   "conveyor.Pipeline: max_workers and memory_budget bound the search of plan=\"auto\"");
    check_argument(!inputs.across_processes || options.balance() != Balance::kTime || options.profile() ||
                       !options.boundaries().empty() || !options.split_points().empty(),
                   "conveyor.Pipeline: balance \"time\" across processes would let each process measure its own ",
                   "times and perhaps cut the model elsewhere: give split_points, or balance \"uniform\" or ",
                   "\"parameters\"");
    return;
  }
  check_argument(options.boundaries().empty() && options.split_points().empty(), "conveyor.Pipeline: plan \"", name,
                 "\" chooses where to cut: give no split_points");
  check_argument(inputs.sample != nullptr || (options.profile() && inputs.batch_size > 0), "conveyor.Pipeline: plan \"",
                 name, "\" profiles the model: give sample=(inputs, target), a batch of the size each step trains ",
                 "on");
  check_argument(!inputs.across_processes, "conveyor.Pipeline: plan \"", name, "\" searches in one process (each ",
                 "process would measure its own times and might choose another plan): search in one, then pass ",
                 "its choices to all");
  check_argument(!options.schedule_text().empty() || schedules::make_schedule(options.schedule(), 1, 1).synchronous(),
                 "conveyor.Pipeline: plan \"", name, "\" searches the synchronous schedules: leave out schedule \"",
                 options.schedule(), "\"");
  check_argument(mode != PlanMode::kTuned || (inputs.sample != nullptr && static_cast<bool>(inputs.loss)),
                 "conveyor.Pipeline: plan \"tuned\" trains on the sample: give a sample and a loss");
}

Plan decide_plan(const torch::nn::Sequential& layers, PipelineOptions options,
                             const PlanInputs& inputs) {
  if (!inputs.checked) check_plan_mode(options, inputs);
  const SampleBatch* sample = inputs.sample;
  const TensorsLossFn& loss = inputs.loss;
  const PlanMode mode = options.plan();
  if (mode != PlanMode::kGiven) options.balance(Balance::kTime);
  if (options.balance() == Balance::kTime && !options.profile()) {
    check_argument(sample != nullptr, "conveyor: balance by time profiles the model on a sample batch: give one");
    options.profile(std::make_shared<ModelProfile>(
        profile_first_microbatch(layers, sample->inputs, sample->targets, loss, options)));
  }
  if (mode == PlanMode::kGiven) return {std::move(options), ""};
  SearchSpace space;
  space.max_workers = options.max_workers() > 0 ? options.max_workers() : options.workers() > 0 ? options.workers() : 4;
  space.memory_budget = options.memory_budget();
  const int64_t batch = inputs.batch_size > 0 ? inputs.batch_size : batch_size(*sample, options);
  const SearchResult search = search_plans(layers, options, batch, space);
  if (mode == PlanMode::kAuto) return {search.best().options(std::move(options)), search.str()};
  const Race tuning = race_candidates(layers, search, options, sample->inputs, sample->targets, loss);
  return {tuning.best().options(std::move(options)), search.str() + "tuned: " + tuning.str()};
}

}  // namespace conveyor
