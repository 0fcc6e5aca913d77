#include "schedules/simulate.h"

#include "schedules/validate.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

namespace conveyor::schedules {

StageCosts StageCosts::uniform(int num_stages, double forward, double backward, double transfer) {
  StageCosts costs;
  costs.forward.assign(num_stages, forward);
  costs.backward.assign(num_stages, backward);
  costs.transfer = transfer;
  return costs;
}

namespace {

// Finished-time keys: (stage, what, micro-batch). 'F': the forward's output is
// ready; 'G': the backward's input gradient is ready (B or I); 'I': an I
// ended (its W may start).
using Key = std::tuple<int, char, int>;

}  // namespace

Simulation simulate(const Schedule& s, const StageCosts& costs) {
  const int num = s.num_stages, workers = s.num_workers();
  if (static_cast<int>(costs.forward.size()) != num || static_cast<int>(costs.backward.size()) != num) {
    throw ScheduleError("simulate: costs are given for " + std::to_string(costs.forward.size()) + " forward and " +
                        std::to_string(costs.backward.size()) + " backward stages, the schedule has " +
                        std::to_string(num));
  }
  std::map<Key, double> finished;
  std::vector<size_t> pc(workers, 0);
  std::vector<double> free_at(workers, 0.0);
  Simulation sim;
  sim.busy.assign(workers, 0.0);
  sim.stage_busy.assign(num, 0.0);
  sim.peak_inflight.assign(num, 0);
  sim.timeline.resize(workers);
  std::vector<int> inflight(num, 0);

  // Ready time of an action's input, or a negative value if not yet known.
  const auto ready = [&](const Action& a) -> double {
    const auto at = [&](const Key& key, double plus) {
      const auto it = finished.find(key);
      return it == finished.end() ? -1.0 : it->second + plus;
    };
    if (a.kind == ActionKind::kWeight) return at({a.stage, 'I', a.microbatch}, 0.0);
    const bool fwd = a.kind == ActionKind::kForward;
    const int from = fwd ? a.stage - 1 : a.stage + 1;
    if (from < 0 || from >= num) {
      if (fwd) return 0.0;
      return at({a.stage, 'F', a.microbatch}, 0.0);  // the loss: after our own forward
    }
    return at({from, fwd ? 'F' : 'G', a.microbatch}, costs.transfer_after(std::min(from, a.stage)));
  };
  const auto cost = [&](const Action& a) {
    const int k = a.stage;
    const double replay = replays_forward(s.stash) ? costs.forward[k] : 0.0;
    switch (a.kind) {
      case ActionKind::kForward:
        return costs.forward[k];
      case ActionKind::kBackward:
        return costs.backward[k] + replay;
      case ActionKind::kBackwardInput:
        return costs.input_of(k) + replay;
      case ActionKind::kWeight:
        return costs.weight_of(k);
    }
    return 0.0;
  };

  std::vector<size_t> barriers_passed(workers, 0);
  const auto at_barrier = [&](int w) {
    return !s.barriers.empty() && barriers_passed[w] < s.barriers[w].size() &&
           s.barriers[w][barriers_passed[w]] == pc[w];
  };
  // Actions run in the order they can start (their worker free and their
  // input arrived), so that shared cores go to the earliest; without shared
  // cores every start is the same in any order.
  std::vector<double> core_free(static_cast<size_t>(std::max(0, costs.cores)), 0.0);
  size_t remaining = s.num_actions();
  while (remaining > 0 || (!s.barriers.empty() && barriers_passed[0] < s.barriers[0].size())) {
    bool all_at_barrier = !s.barriers.empty();
    for (int w = 0; w < workers; ++w) all_at_barrier = all_at_barrier && at_barrier(w);
    if (all_at_barrier) {
      const double release = *std::max_element(free_at.begin(), free_at.end());
      for (int w = 0; w < workers; ++w) {
        free_at[w] = release;
        ++barriers_passed[w];
      }
      continue;
    }
    int next = -1;
    double earliest = 0;
    for (int w = 0; w < workers; ++w) {
      if (pc[w] >= s.workers[w].size() || at_barrier(w)) continue;
      const double input = ready(s.workers[w][pc[w]]);
      if (input < 0) continue;
      const double can_start = std::max(free_at[w], input);
      if (next < 0 || can_start < earliest) next = w, earliest = can_start;
    }
    if (next < 0) {
      for (int w = 0; w < workers; ++w) {
        if (pc[w] < s.workers[w].size() && !at_barrier(w)) {
          throw ScheduleError("simulate: " + std::string(s.has_virtual_stages() ? "worker " : "stage ") +
                              std::to_string(w) + " waits forever at " + s.workers[w][pc[w]].str() +
                              ": the action it depends on never runs first");
        }
      }
      throw ScheduleError("simulate: the stages never all meet at a barrier");
    }
    const int w = next;
    const Action& a = s.workers[w][pc[w]];
    const int k = a.stage;
    double start = earliest;
    auto core = core_free.end();
    if (!core_free.empty()) {
      core = std::min_element(core_free.begin(), core_free.end());
      start = std::max(start, *core);
    }
    const double end = start + cost(a);
    if (core != core_free.end()) *core = end;
    switch (a.kind) {
      case ActionKind::kForward:
        finished[{k, 'F', a.microbatch}] = end;
        ++inflight[k];
        break;
      case ActionKind::kBackwardInput:
        finished[{k, 'I', a.microbatch}] = end;
        finished[{k, 'G', a.microbatch}] = end;
        break;
      case ActionKind::kBackward:
        finished[{k, 'G', a.microbatch}] = end;
        --inflight[k];
        break;
      case ActionKind::kWeight:
        --inflight[k];
        break;
    }
    free_at[w] = end;
    sim.busy[w] += end - start;
    sim.stage_busy[k] += end - start;
    sim.timeline[w].push_back({a, start, end});
    sim.peak_inflight[k] = std::max(sim.peak_inflight[k], inflight[k]);
    ++pc[w];
    --remaining;
  }
  sim.makespan = *std::max_element(free_at.begin(), free_at.end());
  double busy = 0;
  for (double b : sim.busy) busy += b;
  sim.bubble_fraction = sim.makespan > 0 ? 1.0 - busy / (workers * sim.makespan) : 0.0;
  return sim;
}

}  // namespace conveyor::schedules
