#pragma once
// Schedule: the ordered actions of every stage, and what the runtime must do
// around them. It prints and parses as text, one line per stage after a
// header, so schedules diff and load as files:
//
//   # schedule 1f1b stages=2 microbatches=2
//   0F0 0F1 0B0 0B1
//   1F0 1B0 1F1 1B1
//
// Asynchronous methods add declarations to the header (only those that differ
// from the defaults are printed) and may cut the lines into lock-step
// iterations with '|': no stage starts iteration i+1 before every stage has
// finished iteration i.
//
//   # schedule ddg stages=2 microbatches=2 weights=stashed step=microbatch
//   0F0 | 0F1 0B0 | 0B1
//   1F0 1B0 | 1F1 1B1 |

#include "schedules/action.h"

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace conveyor::schedules {

// What a stage keeps between a micro-batch's forward and its backward.
enum class Stash {
  kActivations,  // the forward's autograd graph: the backward reuses it ("stash=activations")
  kInputs,       // the stage input only: the backward replays the forward first ("stash=inputs")
};

struct Schedule {
  std::string name;
  int num_stages = 0;
  int num_microbatches = 0;
  std::vector<std::vector<Action>> stages;  // stages[k]: what stage k does, in order

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
  // barriers[k]: positions in stages[k] before which a lock-step barrier
  // stands (the same number on every stage; a position may equal the size).
  std::vector<std::vector<size_t>> barriers;

  bool synchronous() const { return !step_per_microbatch; }
  size_t num_actions() const;
  std::string str() const;

  // Reads the text form. The header is optional: without it the stage count is
  // the number of action lines and the micro-batch count one more than the
  // largest micro-batch named. Actions may be separated by spaces or commas;
  // blank lines and other lines starting with '#' are ignored. Throws
  // std::invalid_argument naming the line and the offending text. Parsing
  // does not validate: see validate().
  static Schedule parse(std::string_view text);

  friend bool operator==(const Schedule&, const Schedule&) = default;
};

// For a schedule with step_per_microbatch: versions[k][mb] is the weight
// version stage k's forward of mb reads, counted in that stage's optimizer
// steps since the schedule began (0: the weights it started with).
std::vector<std::vector<int>> forward_versions(const Schedule& schedule);

}  // namespace conveyor::schedules
