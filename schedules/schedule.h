#pragma once
// Schedule: the ordered actions of every worker, and what the runtime must do
// around them. It prints and parses as text, one line per worker after a
// header, so schedules diff and load as files:
//
//   # schedule 1f1b stages=2 microbatches=2
//   0F0 0F1 0B0 0B1
//   1F0 1B0 1F1 1B1
//
// A worker is a thread (or a process) that runs its line in order. Usually
// worker k runs stage k alone. With virtual stages a worker runs several
// model chunks: the model is cut into more stages than there are workers and
// each line interleaves the actions of the stages its worker hosts (the
// placement; parse() reads it off the lines):
//
//   # schedule interleaved stages=4 microbatches=2
//   0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1      <- worker 0 runs stages 0 and 2
//   1F0 1F1 3F0 3B0 3F1 3B1 1B0 1B1      <- worker 1 runs stages 1 and 3
//
// Asynchronous methods add declarations to the header (only those that differ
// from the defaults are printed) and may cut the lines into lock-step
// iterations with '|': no stage starts iteration i+1 before every stage has
// finished iteration i.
//
//   # schedule ddg stages=2 microbatches=2 weights=stashed step=microbatch
//   0F0 | 0F1 0B0 | 0B1
//   1F0 1B0 | 1F1 1B1 |
//
// The text is also torch.distributed.pipelining's CSV schedule format (one
// row of comma-separated actions per rank, F/I/W/B), so its schedules load.
//
// A stage whose replicas shard its parameters or gradients (ZeRO) says when
// it gathers, frees and reduces them with sharding actions, PyTorch's names
// (schedules/sharding.h places them and states the rules validate() checks):
//
//   # schedule 1f1b stages=2 microbatches=2
//   0UNSHARD 0F0 0F1 0B0 0B1 0RESHARD 0REDUCE_GRAD
//   1UNSHARD 1F0 1B0 1F1 1B1 1RESHARD 1REDUCE_GRAD

#include "schedules/action.h"

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace conveyor::schedules {

// What a stage keeps between a micro-batch's forward and its backward.
enum class Stash {
  kActivations,  // the forward's autograd graph: the backward reuses it ("stash=activations")
  kInputs,       // the stage input only: the backward replays the forward first ("stash=inputs";
                 // activation recomputation)
  kOffload,      // as kInputs, but the input waits in host memory and comes back to the
                 // device ahead of its backward ("stash=offload")
};

// True when the backward replays the forward from the stage input.
inline bool replays_forward(Stash stash) { return stash != Stash::kActivations; }

struct Schedule {
  std::string name;
  int num_stages = 0;
  int num_microbatches = 0;
  // workers[w]: what worker w does, in order (one stage per worker: worker k
  // runs stage k).
  std::vector<std::vector<Action>> workers;
  // placement[k]: the worker that runs stage k. Empty: worker k runs stage k.
  // parse() reads it off the lines (-1 for a stage no line names).
  std::vector<int> placement;

  // --- declarations the runtime obeys (defaults: a synchronous schedule) ---
  Stash stash = Stash::kActivations;
  // A backward differentiates the weights its forward used, kept as a read-only
  // copy ("weights=stashed"), instead of the live weights ("weights=live").
  bool weight_stashing = false;
  // The optimizer steps on a stage after each of its backwards
  // ("step=microbatch"), each micro-batch being a mini-batch of its own,
  // instead of once after the whole schedule ("step=batch").
  bool step_per_microbatch = false;
  // Every stage's forward of a micro-batch uses the weight version stage 0's
  // forward used ("sync=vertical"); otherwise each stage's latest version.
  bool vertical_sync = false;
  // barriers[w]: positions in workers[w] before which a lock-step barrier
  // stands (the same number on every stage; a position may equal the size).
  std::vector<std::vector<size_t>> barriers;
  // sharding[w]: worker w's sharding actions, each standing before
  // workers[w][position] (a position may equal the size), in order. Empty:
  // the schedule says nothing of replicas (no gathers, no reductions).
  struct PlacedShard {
    size_t position = 0;
    ShardAction action;
    friend bool operator==(const PlacedShard&, const PlacedShard&) = default;
  };
  std::vector<std::vector<PlacedShard>> sharding;

  bool synchronous() const { return !step_per_microbatch; }
  int num_workers() const { return static_cast<int>(workers.size()); }
  int worker_of(int stage) const { return placement.empty() ? stage : placement.at(stage); }
  // Whether some worker runs several stages.
  bool has_virtual_stages() const { return num_workers() != num_stages; }
  // Whether some backward is split into I and W.
  bool splits_backward() const;
  // Whether some worker's line has a sharding action.
  bool has_sharding() const;
  size_t num_actions() const;
  std::string str() const;

  // Reads the text form. The header is optional: without it the stage count is
  // one more than the largest stage named (at least the number of lines) and
  // the micro-batch count one more than the largest micro-batch named. Actions may be separated by spaces or commas;
  // blank lines and other lines starting with '#' are ignored. Throws
  // std::invalid_argument naming the line and the offending text. Parsing
  // does not validate: see validate().
  static Schedule parse(std::string_view text);

  friend bool operator==(const Schedule&, const Schedule&) = default;
};

// The actions of stage k, in the order its worker runs them.
std::vector<Action> stage_actions(const Schedule& schedule, int k);

// For a schedule with step_per_microbatch: versions[k][mb] is the weight
// version stage k's forward of mb reads, counted in that stage's optimizer
// steps since the schedule began (0: the weights it started with).
std::vector<std::vector<int>> forward_versions(const Schedule& schedule);

}  // namespace conveyor::schedules
