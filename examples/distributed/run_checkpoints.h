#pragma once
// A distributed run that survives a lost rank: every `every` steps each rank
// writes its own checkpoint (its stages' weights, optimizer state or its
// replica's part of it, update counts and random streams) to
// <dir>/step<S>-rank<R>-of<W>.ckpt, atomically, and keeps the previous one.
// When torchrun restarts the job after a rank died (--max-restarts), resume()
// finds the newest step whose W files are all there and loads it, so the
// restarted run takes the same steps as one that never stopped. A job of
// another size (other --workers or --replicas) resumes from every rank's
// files, resharded (load_checkpoint_files); one of the same size loads its
// own file, so it must keep the stages and replicas it had.

#include "plugin/pipeline.h"

#include <cstdint>
#include <string>

namespace conveyor::examples {

class RunCheckpoints {
 public:
  // `every` 0: no checkpoints.
  RunCheckpoints(std::string dir, int every, int rank, int world)
      : dir_(std::move(dir)), every_(every), rank_(rank), world_(world) {}

  // The step to start from: 0, or the newest step every rank has a file of,
  // loaded into `pipe` (built across processes). Collective over every rank.
  int64_t resume(Pipeline& pipe);
  // After `steps` steps: checkpoints when it is a multiple of `every`, then
  // removes this rank's file before the previous one. Local.
  void after_step(const Pipeline& pipe, int64_t steps);

 private:
  std::string file(int64_t step, int rank, int world) const;
  std::string dir_;
  int every_;
  int rank_;
  int world_;
};

}  // namespace conveyor::examples
