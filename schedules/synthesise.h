#pragma once
// synthesise(): builds a schedule for measured costs under a memory cap, where
// the fixed families (1F1B, ZB-H1, ZB-V, ...) assume equal stages and offer
// memory as a choice between a few shapes.
//
// Given per-stage F, I (input gradient) and W (weight gradient) times, the
// activation a micro-batch keeps on each stage from its F until its W, the
// link's latency, the workers, the chunks per worker (1: stage k on worker k;
// 2: a V, stages k and 2K-1-k on worker k, so the last stage shares worker 0
// with the first and the turn from stage K-1 to K stays on worker K-1), M and
// a cap on what each worker holds at once, it returns a schedule that
//   - validate() accepts at the given channel capacity (no deadlock),
//   - never holds more than the cap on any worker (peak_memory says how much),
//   - has the shortest simulated makespan this method finds.
//
// The method: list scheduling in simulated time, as the zero-bubble paper's
// heuristic does. Each worker, whenever it is free, runs the ready action its
// policy prefers: an I (on the critical path: the previous stage waits for
// it), else an F if the cap allows, else a W (which fills a gap and frees
// memory); a new micro-batch enters a worker only when the worker can hold it
// on the whole V (room for its later chunk as well), so a V never strands its
// second chunk. The policies differ in when a W runs (whenever nothing else
// can start, or only where it delays no I or F; always when an F waits for
// memory), whether an F goes before an I that could start as early, and which
// chunk's F goes first. They race at the cap and at each cap one
// micro-batch's largest activation lower (a schedule for less memory fits
// more, and a pass that fills a large cap may start more forwards than pay;
// with caps in micro-batches, more memory never gives a slower schedule), and
// so do repeated patterns (modulo_schedule(), schedules/modulo.h: one
// micro-batch's actions placed modulo an interval, at the busiest worker's
// F + I + W and at longer ones, which hold less; placed for the problem's
// costs and for equal ones) and the fixed families that
// fit the placement and the cap (sequential, 1F1B, ZB-H1, GPipe; DualPipeV on
// a V): the shortest simulated makespan
// wins, so the result is never slower than a fixed family that fits. A race
// of cheap greedy passes rather than a search over orders: each pass is
// linear in the actions, so the planner can synthesise for every candidate
// plan it prices. Deterministic: the same problem gives the same schedule.

#include "schedules/schedule.h"
#include "schedules/simulate.h"

#include <string>
#include <vector>

namespace conveyor::schedules {

struct SynthesisProblem {
  int workers = 0;
  int chunks = 1;  // 1 or 2 (a V)
  int microbatches = 0;
  // Per stage (workers * chunks of them, in model order).
  std::vector<double> forward;
  std::vector<double> input;   // a split backward's I
  std::vector<double> weight;  // its W
  // A whole backward (B), for the fixed families that do not split it; a
  // split often costs more than B (W walks the graph again). Empty: I + W.
  std::vector<double> backward;
  // What a micro-batch keeps on each stage from its F until its W, in any unit
  // (bytes, or micro-batches' worth). Empty: 1 each.
  std::vector<double> activation;
  double latency = 0;       // one transfer between two workers (a turn within a worker costs nothing)
  // Per boundary (stage s to s+1): its transfer, measured; overrides latency.
  std::vector<double> transfers;
  double memory_cap = 0;    // per worker, in activation's unit; 0: no cap
  int channel_capacity = 2;
  // Whether the fixed families that fit join the race (false: the greedy
  // policies alone, to see what they find).
  bool race_fixed_families = true;
  // Whether the greedy passes also race at the caps below memory_cap, one
  // largest activation apart (false: at the cap alone, as the named V
  // schedules are defined).
  bool race_lower_caps = true;
  std::string name = "synthesised";
};

struct Synthesis {
  Schedule schedule;
  Simulation simulation;             // of the schedule, with the problem's costs
  std::vector<double> peak_memory;   // per worker, in activation's unit
  std::string method;                // the policy or fixed family that won
};

// Throws std::invalid_argument naming the problem: sizes that do not match,
// chunks other than 1 or 2, a cap below what one micro-batch needs on a worker.
Synthesis synthesise(const SynthesisProblem& problem);

// Stage -> worker of a V on K workers: stage k and stage 2K-1-k on worker k.
std::vector<int> v_placement(int workers);

// The costs of a problem as simulate() takes them (a turn within a worker has
// no transfer).
StageCosts synthesis_costs(const SynthesisProblem& problem);

// Per worker: the most a schedule holds at once, each stage's micro-batch
// holding `activation` (empty: 1) from its F until its W or whole B.
std::vector<double> peak_worker_memory(const Schedule& schedule, const std::vector<double>& activation = {});

}  // namespace conveyor::schedules
