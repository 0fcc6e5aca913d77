#pragma once
// A stage's own optimizer (PipelineOptions::optimizer) in a checkpoint: its
// whole state ("optimizer"), or a replica's part of a state sharded across
// data-parallel replicas ("optimizer_shard": {"replica", "replicas",
// "optimizer": the state of the replica's flat pieces of the weights, by the
// weights' names}; plugin/model/sharded_state.h).

#include "plugin/checkpoint/checkpoint_decode.h"

#include <functional>
#include <map>
#include <string>

namespace conveyor {

// What restores stage k's own optimizer from its saved entry `saved` (of a
// checkpoint at the same stage count), or an empty function when neither
// side has one. A whole state restores into any target (a sharded one takes
// its part of it); a part, only into the same replica of as many replicas.
// Throws std::invalid_argument, prefixed with `what` (`damaged` for a value
// of the wrong kind), otherwise.
std::function<void()> stage_optimizer_restorer(const c10::impl::GenericDict& saved,
                                               const CheckpointTarget::Stage& stage, int k,
                                               const std::map<const void*, std::string>& names,
                                               const std::string& what, const std::string& damaged);

// `restore` (of a whole state into stage.optimizer), then, for a sharded
// stage, its part taken.
std::function<void()> then_take_shard(std::function<void()> restore, const CheckpointTarget::Stage& stage);

}  // namespace conveyor
