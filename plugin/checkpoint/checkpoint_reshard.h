#pragma once
// Resuming at another number of stages (plugin/checkpoint/checkpoint.h): the
// model's values and the caller's optimizers are stored by parameter name
// and need nothing; what is per stage is regrouped here: each new stage's own
// optimizer (PipelineOptions::optimizer) gets the saved state of the
// parameters it now holds, and every stage the update count they shared.

#include "plugin/checkpoint/checkpoint_decode.h"
#include "plugin/checkpoint/checkpoint_values.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace conveyor {

struct ResharedStages {
  int64_t updates = 0;                              // every new stage's
  std::vector<std::function<void()>> restore;       // the new stages' own optimizers
};

// Checks `saved_stages` (a checkpoint's "stages", of another count than the
// target's) and regroups them for `target`. Throws std::invalid_argument,
// prefixed with `what`, when they cannot be: a file that holds only some
// stages (a process's own file), stages that made different numbers of
// updates (an asynchronous schedule's), stage-owned random streams
// (stage_rng), or own optimizers on one side only or of another type.
ResharedStages reshard_stages(const checkpoint_values::List& saved_stages, const CheckpointTarget& target,
                              const std::string& what, const std::string& damaged);

}  // namespace conveyor
