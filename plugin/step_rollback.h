#pragma once
// StepRollback: an asynchronous schedule updates the weights as its step
// goes, so a step that fails part-way would leave some updates done. What it
// changes (each local stage's live weights, optimizer state and update
// count, which a learning-rate schedule reads) is kept before the step and
// put back after a failure, whatever failed.

#include "plugin/stage.h"

#include <memory>
#include <string>
#include <vector>

namespace conveyor {

class StepRollback {
 public:
  void keep(Stage& stage);
  void restore();
  bool empty() const { return saved_.empty(); }

 private:
  struct Saved {
    Stage* stage;
    std::shared_ptr<WeightVersion> weights;
    std::string optimizer;  // serialized; empty without one
    int64_t updates;
  };
  std::vector<Saved> saved_;
};

}  // namespace conveyor
