#pragma once
// simulate(): prices a schedule without running it. Each worker runs its line
// in order, an action starts when its worker is free and its input has
// arrived (forward: the previous stage's forward of that micro-batch plus a
// transfer; backward: the next stage's backward plus a transfer; W: its own
// I), and takes its stage's cost. A backward of a schedule that stashes inputs
// only first replays the forward, so it costs forward + backward. A split
// backward costs its I and W (by default backward - weight and weight). At a lock-step barrier
// every worker waits for the slowest. With StageCosts::cores, actions also
// wait for a free core, taken in the order they become ready (the earliest
// start first); with StageCosts::slowdown they share the CPU instead, each
// running slower while others run. Sharding actions (sharding.h) run on a
// link of their worker's own, beside its compute, one at a time: an UNSHARD
// starts once the compute action before it has started (a prefetch) and a
// RESHARD before it has ended (its memory), and the stage's next action waits
// for it; a REDUCE_GRAD starts once the backward or W before it has ended,
// and the step ends when the last has. Channels are taken as unbounded:
// validate() is what checks blocking. Feed measured per-stage costs and link
// times to predict multi-device runs.

#include "schedules/schedule.h"

#include <vector>

namespace conveyor::schedules {

struct StageCosts {
  std::vector<double> forward;   // per stage: time of one micro-batch's forward
  std::vector<double> backward;  // per stage: time of one micro-batch's backward
  double transfer = 0;           // time to move one tensor between neighbouring stages
  // Per boundary (stage k to k+1, K-1 of them): the time to move a
  // micro-batch's activations across it, and its gradients back. Overrides
  // `transfer` where given (a measured link and the boundary's bytes).
  std::vector<double> transfers;
  // Per stage: the share of `backward` that computes the weight gradients (a
  // W's cost). Empty: half the backward.
  std::vector<double> weight;
  // Per stage: a split backward's I (input gradients). Empty: backward -
  // weight. A split may cost more than the whole backward it replaces: a
  // layer's W walks its graph again from the layer's outputs.
  std::vector<double> input;
  // Cores the workers share (threads on one CPU): at most this many actions
  // run at once, a ready action waiting for the first core free. 0: every
  // worker has a device of its own.
  int cores = 0;
  // Workers that share one CPU, measured: slowdown[n - 1] is how much longer
  // an action takes while n actions run at once (slowdown[0] = 1 alone; past
  // the end, the last entry grows in proportion to n). Every running action
  // progresses at 1 / slowdown[n - 1] of its speed alone, so an action that
  // starts or ends changes how fast the others go. Given, it replaces `cores`.
  std::vector<double> slowdown;
  // Per stage: the time an UNSHARD takes (gathering its parameters from the
  // replicas' shards) and a REDUCE_GRAD (reducing its gradients across them).
  // Empty: no time.
  std::vector<double> unshard;
  std::vector<double> reduce_grad;

  double transfer_after(int k) const { return k < static_cast<int>(transfers.size()) ? transfers[k] : transfer; }
  double weight_of(int k) const { return k < static_cast<int>(weight.size()) ? weight[k] : backward[k] / 2; }
  double input_of(int k) const { return k < static_cast<int>(input.size()) ? input[k] : backward[k] - weight_of(k); }
  double unshard_of(int k) const { return k < static_cast<int>(unshard.size()) ? unshard[k] : 0.0; }
  double reduce_grad_of(int k) const { return k < static_cast<int>(reduce_grad.size()) ? reduce_grad[k] : 0.0; }

  // The same forward and backward cost on every stage.
  static StageCosts uniform(int num_stages, double forward, double backward, double transfer = 0);
  // slowdown's factor for n actions running at once (1 without a slowdown).
  double slowdown_at(int n) const;
};

struct ActionTiming {
  Action action;
  double start = 0;
  double end = 0;
};

struct ShardTiming {
  ShardAction action;
  double start = 0;
  double end = 0;
};

struct Simulation {
  double makespan = 0;
  // 1 - sum(busy) / (workers * makespan): the share of worker-time spent idle.
  double bubble_fraction = 0;
  std::vector<double> busy;                         // per worker (= per stage without virtual stages)
  std::vector<double> stage_busy;                   // per stage
  std::vector<int> peak_inflight;                   // per stage: most forwards not yet freed by a B or W
  std::vector<std::vector<ActionTiming>> timeline;  // per worker, in order
  std::vector<std::vector<ShardTiming>> sharding;   // per worker, in order (empty without sharding actions)
};

// Throws ScheduleError (see validate.h) when costs do not cover every stage or
// when an action waits on one that never runs.
Simulation simulate(const Schedule& schedule, const StageCosts& costs);

}  // namespace conveyor::schedules
