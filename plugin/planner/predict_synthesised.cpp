#include "plugin/planner/predict_synthesised.h"

#include "plugin/core/errors.h"
#include "schedules/synthesise.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace conveyor {

Prediction predict_synthesised(const torch::nn::Sequential& model, const PipelineOptions& options, const Prediction& priced,
                      int64_t batch, int64_t memory_budget) {
  const schedules::Schedule& shape = priced.schedule;
  const int workers = shape.num_workers();
  const int stages = shape.num_stages;
  check_argument(stages == workers || (stages == 2 * workers && shape.placement == schedules::v_placement(workers)),
                 "conveyor: a synthesised schedule takes the split of a plan of 1 chunk per worker or 2 in a V, not '",
                 shape.name, "' (", stages, " stages on ", workers, " workers)");
  const schedules::StageCosts& costs = priced.costs;
  schedules::SynthesisProblem problem;
  problem.name = kSynthesisedSchedule;
  problem.workers = workers;
  problem.chunks = stages / workers;
  problem.microbatches = shape.num_microbatches;
  problem.channel_capacity = std::max(1, options.channel_capacity());
  std::vector<double> fixed(static_cast<size_t>(workers), 0);
  for (int k = 0; k < stages; ++k) {
    problem.forward.push_back(costs.forward.at(k));
    problem.input.push_back(costs.input_of(k));
    problem.weight.push_back(costs.weight_of(k));
    problem.backward.push_back(costs.backward.at(k));
    if (k + 1 < stages) problem.transfers.push_back(costs.transfer_after(k));
    const StagePrediction& p = priced.predicted.at(static_cast<size_t>(k));
    // What one micro-batch keeps on the stage until its W: the stage's
    // predicted stash and activations at its peak, per micro-batch held.
    problem.activation.push_back(static_cast<double>(p.stash_bytes + p.activation_bytes) /
                                 std::max(1, p.peak_inflight));
    fixed.at(static_cast<size_t>(shape.worker_of(k))) +=
        static_cast<double>(p.weight_bytes + p.optimizer_bytes + p.weight_version_bytes);
  }
  if (memory_budget > 0) {
    const double most = *std::max_element(fixed.begin(), fixed.end());
    check_argument(most < static_cast<double>(memory_budget), "conveyor: a memory budget of ", memory_budget,
                   " bytes per worker leaves nothing for activations beside a worker's weights and optimizer state (",
                   static_cast<int64_t>(most), " bytes)");
    // The cap binds the fullest worker: the least room any worker has.
    problem.memory_cap = static_cast<double>(memory_budget) - most;
  }
  const schedules::Synthesis synthesis = schedules::synthesise(problem);
  std::vector<int64_t> boundaries;
  for (size_t k = 1; k < priced.split.stages.size(); ++k) boundaries.push_back(priced.split.stages[k].begin);
  PipelineOptions chosen = options;
  chosen.schedule_text(synthesis.schedule.str()).boundaries(boundaries).workers(workers).chunks(0);
  return predict_step(model, chosen, batch);
}

}  // namespace conveyor
