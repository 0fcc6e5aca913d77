#include "schedules/simulate.h"

#include "schedules/validate.h"

#include <algorithm>
#include <map>
#include <string>

namespace conveyor::schedules {

StageCosts StageCosts::uniform(int num_stages, double forward, double backward, double transfer) {
  return StageCosts{std::vector<double>(num_stages, forward), std::vector<double>(num_stages, backward), transfer};
}

Simulation simulate(const Schedule& s, const StageCosts& costs) {
  const int num = s.num_stages;
  if (static_cast<int>(costs.forward.size()) != num || static_cast<int>(costs.backward.size()) != num) {
    throw ScheduleError("simulate: costs are given for " + std::to_string(costs.forward.size()) + " forward and " +
                        std::to_string(costs.backward.size()) + " backward stages, the schedule has " +
                        std::to_string(num));
  }
  // When each (stage, kind, micro-batch) finished.
  std::map<std::tuple<int, char, int>, double> finished;
  std::vector<size_t> pc(num, 0);
  std::vector<double> free_at(num, 0.0);
  Simulation sim;
  sim.busy.assign(num, 0.0);
  sim.peak_inflight.assign(num, 0);
  sim.timeline.resize(num);
  std::vector<int> inflight(num, 0);

  // Ready time of an action's input, or a negative value if not yet known.
  const auto ready = [&](const Action& a) -> double {
    const bool fwd = a.kind == ActionKind::kForward;
    const int from = fwd ? a.stage - 1 : a.stage + 1;
    if (from < 0 || from >= num) {
      if (fwd) return 0.0;
      const auto it = finished.find({a.stage, 'F', a.microbatch});  // the loss: after our own forward
      return it == finished.end() ? -1.0 : it->second;
    }
    const auto it = finished.find({from, static_cast<char>(a.kind), a.microbatch});
    return it == finished.end() ? -1.0 : it->second + costs.transfer_after(std::min(from, a.stage));
  };

  const bool replay = s.stash == Stash::kInputs;
  std::vector<size_t> barriers_passed(num, 0);
  const auto at_barrier = [&](int k) {
    return !s.barriers.empty() && barriers_passed[k] < s.barriers[k].size() &&
           s.barriers[k][barriers_passed[k]] == pc[k];
  };
  size_t remaining = s.num_actions();
  while (remaining > 0 || (!s.barriers.empty() && barriers_passed[0] < s.barriers[0].size())) {
    bool progressed = false;
    bool all_at_barrier = !s.barriers.empty();
    for (int k = 0; k < num; ++k) all_at_barrier = all_at_barrier && at_barrier(k);
    if (all_at_barrier) {
      const double release = *std::max_element(free_at.begin(), free_at.end());
      for (int k = 0; k < num; ++k) {
        free_at[k] = release;
        ++barriers_passed[k];
      }
      progressed = true;
    }
    for (int k = 0; k < num; ++k) {
      while (pc[k] < s.stages[k].size() && !at_barrier(k)) {
        const Action& a = s.stages[k][pc[k]];
        const double input = ready(a);
        if (input < 0) break;
        const bool fwd = a.kind == ActionKind::kForward;
        const double start = std::max(free_at[k], input);
        const double end = start + (fwd ? costs.forward[k] : costs.backward[k] + (replay ? costs.forward[k] : 0.0));
        finished[{k, static_cast<char>(a.kind), a.microbatch}] = end;
        free_at[k] = end;
        sim.busy[k] += end - start;
        sim.timeline[k].push_back({a, start, end});
        inflight[k] += fwd ? 1 : -1;
        sim.peak_inflight[k] = std::max(sim.peak_inflight[k], inflight[k]);
        ++pc[k];
        --remaining;
        progressed = true;
      }
    }
    if (!progressed) {
      for (int k = 0; k < num; ++k) {
        if (pc[k] < s.stages[k].size()) {
          throw ScheduleError("simulate: stage " + std::to_string(k) + " waits forever at " + s.stages[k][pc[k]].str() +
                              ": the action it depends on never runs first");
        }
      }
      throw ScheduleError("simulate: the stages never all meet at a barrier");
    }
  }
  sim.makespan = *std::max_element(free_at.begin(), free_at.end());
  double busy = 0;
  for (double b : sim.busy) busy += b;
  sim.bubble_fraction = sim.makespan > 0 ? 1.0 - busy / (num * sim.makespan) : 0.0;
  return sim;
}

}  // namespace conveyor::schedules
