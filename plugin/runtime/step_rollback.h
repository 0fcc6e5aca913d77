#pragma once
// StepRollback: an asynchronous schedule updates the weights as its step
// goes, so a step that fails part-way would leave some updates done. What it
// changes (each local stage's live weights, optimizer state and update
// count, which a learning-rate schedule reads) is kept before the step and
// put back after a failure, whatever failed. So are the stages' own random
// streams (PipelineOptions::stage_rng), for every schedule.

#include "plugin/model/stage.h"

#include <torch/optim/optimizer.h>

#include <memory>
#include <utility>
#include <string>
#include <vector>

namespace conveyor {

class StepRollback {
 public:
  // Returns the copy of the stage's weights it keeps.
  std::shared_ptr<const WeightVersion> keep(Stage& stage);
  // Keeps only the stage's random streams, if it has its own (a reference
  // to their state tensors, which drawing replaces rather than changes).
  void keep_random(Stage& stage);
  void restore();
  // Whether weights are kept (random streams alone do not count).
  bool empty() const { return saved_.empty(); }

 private:
  struct Saved {
    Stage* stage = nullptr;
    std::shared_ptr<WeightVersion> weights;
    // The optimizer's state: copied in memory (LibTorch's SGD, Adam, AdamW,
    // Adagrad, RMSprop: per parameter, and each group's learning rate), or
    // serialized (another optimizer); neither without one.
    bool copied = false;
    std::vector<std::pair<void*, std::unique_ptr<torch::optim::OptimizerParamState>>> state;  // as Optimizer::state()
    std::vector<double> lrs;
    std::string optimizer;
    int64_t updates = 0;
  };
  std::vector<Saved> saved_;
  std::vector<std::pair<StageRandom*, StageRandom::State>> random_;
};

}  // namespace conveyor
