#pragma once
// Sharding as actions of the schedule. A stage run by several replicas (data
// parallelism) may shard across them its optimizer state, its gradients and
// its parameters (ZeRO-1, -2, -3). What that costs in time and memory depends
// on when the stage gathers its parameters and reduces its gradients, so the
// schedule says it with three actions on the stage's worker line (action.h):
// UNSHARD gathers, RESHARD frees what was gathered, REDUCE_GRAD reduces the
// gradients made since the last across the replicas.
//
// The rules validate() checks (check_sharding), for each stage, in its
// worker's order:
// - A stage with an UNSHARD or a RESHARD holds only its shard outside its
//   gathered spans (each from an UNSHARD to the next RESHARD): each of its
//   forwards and backwards runs inside one, it gathers only when not
//   gathered, frees only when gathered, and ends the step freed.
// - A stage with a REDUCE_GRAD reduces every gradient it makes: each B and W
//   is followed by a REDUCE_GRAD before the line ends, and each REDUCE_GRAD
//   has a B or W since the last.
// - Only synchronous schedules (step=batch) shard: an update per micro-batch
//   has no step to reduce a gradient for. Nor do schedules with lock-step
//   barriers, which only asynchronous methods have.

#include "schedules/schedule.h"

#include <array>
#include <string>
#include <vector>

namespace conveyor::schedules {

// What a stage's replicas shard, each level adding to the one before. The
// schedule tells the levels below kParameters apart only by what each
// REDUCE_GRAD does (an all-reduce, or a reduce-scatter into the shard), not
// by where it stands: they are placed alike.
enum class ShardLevel {
  kNone,        // nothing: each replica holds everything; gradients are all-reduced
  kOptimizer,   // the optimizer state (ZeRO-1)
  kGradients,   // and the gradients (ZeRO-2): reduce-scattered into each replica's shard
  kParameters,  // and the parameters (ZeRO-3): gathered for use, freed after
};

// The levels by name, in the enumerators' order (as the option shard and
// Python spell them).
constexpr std::array<const char*, 4> value_names(ShardLevel) {
  return {"none", "optimizer", "gradients", "parameters"};
}
const char* shard_level_name(ShardLevel level);
// The level of that name; throws std::invalid_argument naming the four.
ShardLevel shard_level_named(const std::string& name);

// Where place_sharding puts a stage's sharding actions.
struct StageSharding {
  ShardLevel level = ShardLevel::kNone;
  // Reduce after every B or W (gradient storage holds one micro-batch's
  // worth past the shard) instead of once after the stage's last.
  bool reduce_per_microbatch = false;
  // kParameters: free after each run of the stage's actions and gather again
  // before the next (on a worker of several stages, only one stage's
  // parameters are gathered at a time) instead of gathering once before the
  // first forward and freeing after the last backward. On a worker of one
  // stage its actions are one run: the two are the same.
  bool regather = false;
};

// The schedule with every stage's sharding actions placed by the rules above
// (per_stage: one entry per stage, or one for all): REDUCE_GRAD for every
// stage that makes gradients (the replicas' gradient reduction, even at
// kNone, where it is an all-reduce), UNSHARD and RESHARD for kParameters.
// Throws ScheduleError for a schedule that does not validate, already has
// sharding actions or steps per micro-batch.
Schedule place_sharding(const Schedule& schedule, const std::vector<StageSharding>& per_stage);

// Throws ScheduleError naming the first sharding action (or the first action
// of a sharded stage) that breaks the rules above. validate() calls it after
// the checks of the compute actions, which it takes as passed.
void check_sharding(const Schedule& schedule);

// "0UNSHARD on worker 0": the first sharding action of the first worker that
// has one, or "" when the schedule has none (for messages).
std::string first_sharding_action(const Schedule& schedule);

}  // namespace conveyor::schedules
