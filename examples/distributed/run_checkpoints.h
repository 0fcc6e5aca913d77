#pragma once
// A distributed run that survives a lost rank: every `every` steps each rank
// writes its own checkpoint (its stages' weights, optimizer state, update
// counts and random streams) to <dir>/step<S>-rank<R>.ckpt, atomically, and
// keeps the previous one. When torchrun restarts the job after a rank died
// (--max-restarts), resume() finds the newest step whose files every rank
// still has and loads it, so the restarted run takes the same steps as one
// that never stopped.

#include "plugin/distributed/distributed_pipeline.h"

#include <cstdint>
#include <string>

namespace conveyor::examples {

class RunCheckpoints {
 public:
  // `every` 0: no checkpoints.
  RunCheckpoints(std::string dir, int every, int rank) : dir_(std::move(dir)), every_(every), rank_(rank) {}

  // The step to start from: 0, or the newest step every rank has a file of,
  // loaded into `pipe`. Collective over every rank.
  int64_t resume(DistributedPipeline& pipe);
  // After `steps` steps: checkpoints when it is a multiple of `every`, then
  // removes this rank's file before the previous one. Collective with a
  // sharded optimizer (its state is gathered).
  void after_step(DistributedPipeline& pipe, int64_t steps);

 private:
  std::string file(int64_t step) const;
  std::string dir_;
  int every_;
  int rank_;
};

}  // namespace conveyor::examples
