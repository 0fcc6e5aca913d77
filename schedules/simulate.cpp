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

double StageCosts::slowdown_at(int n) const {
  if (slowdown.empty() || n <= 0) return 1.0;
  const int measured = static_cast<int>(slowdown.size());
  return n <= measured ? slowdown[n - 1] : slowdown.back() * n / measured;
}

namespace {

// Finished-time keys: (stage, what, micro-batch). 'F': the forward's output is
// ready; 'G': the backward's input gradient is ready (B or I); 'I': an I
// ended (its W may start).
using Key = std::tuple<int, char, int>;

// What both ways of running the lines share: when an action's input is ready,
// what it costs, and what its end records.
class Engine {
 public:
  Engine(const Schedule& s, const StageCosts& costs) : s_(s), costs_(costs) {
    const int num = s.num_stages, workers = s.num_workers();
    if (static_cast<int>(costs.forward.size()) != num || static_cast<int>(costs.backward.size()) != num) {
      throw ScheduleError("simulate: costs are given for " + std::to_string(costs.forward.size()) + " forward and " +
                          std::to_string(costs.backward.size()) + " backward stages, the schedule has " +
                          std::to_string(num));
    }
    pc_.assign(workers, 0);
    free_at_.assign(workers, 0.0);
    barriers_passed_.assign(workers, 0);
    sim_.busy.assign(workers, 0.0);
    sim_.stage_busy.assign(num, 0.0);
    sim_.peak_inflight.assign(num, 0);
    sim_.timeline.resize(workers);
    inflight_.assign(num, 0);
    remaining_ = s.num_actions();
    if (s.has_sharding()) {
      // What run_sharding indexes (validate() checks the rest).
      bool fits = static_cast<int>(s.sharding.size()) == workers;
      for (int w = 0; fits && w < workers; ++w) {
        for (const auto& p : s.sharding[w]) fits = fits && p.action.stage >= 0 && p.action.stage < num;
      }
      if (!fits) throw ScheduleError("simulate: the sharding actions name a stage or worker the schedule does not have");
      link_free_.assign(workers, 0.0);
      last_start_.assign(workers, 0.0);
      freed_at_.assign(workers, 0.0);
      shard_next_.assign(workers, 0);
      gathered_at_.assign(num, 0.0);
      gradient_at_.assign(num, 0.0);
      sim_.sharding.resize(workers);
      for (int w = 0; w < workers; ++w) run_sharding(w);
    }
  }

  int workers() const { return s_.num_workers(); }
  const StageCosts& costs() const { return costs_; }
  bool has_next(int w) const { return pc_[w] < s_.workers[w].size() && !at_barrier(w); }
  const Action& next(int w) const { return s_.workers[w][pc_[w]]; }
  double free_at(int w) const { return free_at_[w]; }
  bool done() const { return remaining_ == 0 && !barrier_ahead(); }

  // Ready time of an action's input, or a negative value if not yet known.
  double ready(const Action& a) const {
    const auto at = [&](const Key& key, double plus) {
      const auto it = finished_.find(key);
      return it == finished_.end() ? -1.0 : it->second + plus;
    };
    const double input = [&] {
      if (a.kind == ActionKind::kWeight) return at({a.stage, 'I', a.microbatch}, 0.0);
      const bool fwd = a.kind == ActionKind::kForward;
      const int from = fwd ? a.stage - 1 : a.stage + 1;
      if (from < 0 || from >= s_.num_stages) {
        if (fwd) return 0.0;
        return at({a.stage, 'F', a.microbatch}, 0.0);  // the loss: after our own forward
      }
      return at({from, fwd ? 'F' : 'G', a.microbatch}, costs_.transfer_after(std::min(from, a.stage)));
    }();
    // A gathering stage's action also waits for its last UNSHARD.
    return input < 0 || gathered_at_.empty() ? input : std::max(input, gathered_at_[a.stage]);
  }

  double cost(const Action& a) const {
    const int k = a.stage;
    const double replay = replays_forward(s_.stash) ? costs_.forward[k] : 0.0;
    switch (a.kind) {
      case ActionKind::kForward:
        return costs_.forward[k];
      case ActionKind::kBackward:
        return costs_.backward[k] + replay;
      case ActionKind::kBackwardInput:
        return costs_.input_of(k) + replay;
      case ActionKind::kWeight:
        return costs_.weight_of(k);
    }
    return 0.0;
  }

  // Worker w's next action ran from start to end.
  void finish(int w, double start, double end) {
    const Action& a = next(w);
    const int k = a.stage;
    switch (a.kind) {
      case ActionKind::kForward:
        finished_[{k, 'F', a.microbatch}] = end;
        ++inflight_[k];
        break;
      case ActionKind::kBackwardInput:
        finished_[{k, 'I', a.microbatch}] = end;
        finished_[{k, 'G', a.microbatch}] = end;
        break;
      case ActionKind::kBackward:
        finished_[{k, 'G', a.microbatch}] = end;
        --inflight_[k];
        break;
      case ActionKind::kWeight:
        --inflight_[k];
        break;
    }
    free_at_[w] = end;
    sim_.busy[w] += end - start;
    sim_.stage_busy[k] += end - start;
    sim_.timeline[w].push_back({a, start, end});
    sim_.peak_inflight[k] = std::max(sim_.peak_inflight[k], inflight_[k]);
    if (!gradient_at_.empty()) {
      last_start_[w] = start;
      if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kWeight) gradient_at_[k] = end;
    }
    ++pc_[w];
    --remaining_;
    if (!link_free_.empty()) run_sharding(w);
  }

  // Every worker waits at a lock-step barrier: all pass it when the last is
  // free (true), or not all of them are there (false).
  bool pass_barrier() {
    bool all = !s_.barriers.empty();
    for (int w = 0; w < workers(); ++w) all = all && at_barrier(w);
    if (!all) return false;
    const double release = *std::max_element(free_at_.begin(), free_at_.end());
    for (int w = 0; w < workers(); ++w) {
      free_at_[w] = release;
      ++barriers_passed_[w];
    }
    return true;
  }

  [[noreturn]] void stuck() const {
    for (int w = 0; w < workers(); ++w) {
      if (has_next(w)) {
        throw ScheduleError("simulate: " + std::string(s_.has_virtual_stages() ? "worker " : "stage ") +
                            std::to_string(w) + " waits forever at " + next(w).str() +
                            ": the action it depends on never runs first");
      }
    }
    throw ScheduleError("simulate: the stages never all meet at a barrier");
  }

  Simulation result() {
    sim_.makespan = *std::max_element(free_at_.begin(), free_at_.end());
    for (double t : link_free_) sim_.makespan = std::max(sim_.makespan, t);
    double busy = 0;
    for (double b : sim_.busy) busy += b;
    sim_.bubble_fraction = sim_.makespan > 0 ? 1.0 - busy / (workers() * sim_.makespan) : 0.0;
    return std::move(sim_);
  }

 private:
  bool at_barrier(int w) const {
    return !s_.barriers.empty() && barriers_passed_[w] < s_.barriers[w].size() &&
           s_.barriers[w][barriers_passed_[w]] == pc_[w];
  }
  // The sharding actions that stand before worker w's next action: each
  // takes the worker's link in turn (a RESHARD only frees memory: no time).
  void run_sharding(int w) {
    const auto& line = s_.sharding[w];
    for (; shard_next_[w] < line.size() && line[shard_next_[w]].position == pc_[w]; ++shard_next_[w]) {
      const ShardAction& a = line[shard_next_[w]].action;
      double start = link_free_[w], cost = 0;
      if (a.kind == ShardKind::kUnshard) {
        start = std::max({start, last_start_[w], freed_at_[w]});  // after a RESHARD before it: its memory
        cost = costs_.unshard_of(a.stage);
      } else if (a.kind == ShardKind::kReduceGrad) {
        start = std::max(start, gradient_at_[a.stage]);
        cost = costs_.reduce_grad_of(a.stage);
      } else {
        start = std::max(last_start_[w], free_at_[w]);
      }
      const double end = start + cost;
      if (a.kind != ShardKind::kReshard) link_free_[w] = end;
      if (a.kind == ShardKind::kUnshard) gathered_at_[a.stage] = end;
      if (a.kind == ShardKind::kReshard) freed_at_[w] = end;
      sim_.sharding[w].push_back({a, start, end});
    }
  }
  bool barrier_ahead() const { return !s_.barriers.empty() && barriers_passed_[0] < s_.barriers[0].size(); }

  const Schedule& s_;
  const StageCosts& costs_;
  std::map<Key, double> finished_;
  std::vector<size_t> pc_, barriers_passed_;
  std::vector<double> free_at_;
  std::vector<int> inflight_;
  // With sharding actions: per worker, when its link is free, when its last
  // action started, its last RESHARD and the next sharding action to run; per stage, when its
  // last UNSHARD and its last B or W ended.
  std::vector<double> link_free_, last_start_, freed_at_, gathered_at_, gradient_at_;
  std::vector<size_t> shard_next_;
  size_t remaining_ = 0;
  Simulation sim_;
};

// Each action runs alone on its worker's device (or waits for one of
// `cores`): actions are taken in the order they can start (their worker free
// and their input arrived), so that shared cores go to the earliest; without
// shared cores every start is the same in any order.
Simulation run_in_turn(Engine& e) {
  std::vector<double> core_free(static_cast<size_t>(std::max(0, e.costs().cores)), 0.0);
  while (!e.done()) {
    if (e.pass_barrier()) continue;
    int next = -1;
    double earliest = 0;
    for (int w = 0; w < e.workers(); ++w) {
      if (!e.has_next(w)) continue;
      const double input = e.ready(e.next(w));
      if (input < 0) continue;
      const double can_start = std::max(e.free_at(w), input);
      if (next < 0 || can_start < earliest) next = w, earliest = can_start;
    }
    if (next < 0) e.stuck();
    double start = earliest;
    auto core = core_free.end();
    if (!core_free.empty()) {
      core = std::min_element(core_free.begin(), core_free.end());
      start = std::max(start, *core);
    }
    const double end = start + e.cost(e.next(next));
    if (core != core_free.end()) *core = end;
    e.finish(next, start, end);
  }
  return e.result();
}

// Actions share the CPU: time advances from event to event (an action
// starts, an input arrives, an action ends), and between two events every
// running action does 1 / slowdown(n) seconds of its work per second.
Simulation run_sharing(Engine& e) {
  struct Running {
    double start = 0, left = 0;  // left: seconds of work alone
  };
  std::vector<Running> running(e.workers());
  std::vector<bool> busy(e.workers(), false);
  double now = 0;
  while (!e.done()) {
    int n = 0;
    for (int w = 0; w < e.workers(); ++w) n += busy[w];
    if (n == 0 && e.pass_barrier()) continue;
    double arrival = -1;  // the next input to arrive for an idle worker
    for (int w = 0; w < e.workers(); ++w) {
      if (busy[w] || !e.has_next(w)) continue;
      const double input = e.ready(e.next(w));
      if (input < 0) continue;
      if (input <= now) {
        running[w] = {now, e.cost(e.next(w))};
        busy[w] = true;
        ++n;
      } else if (arrival < 0 || input < arrival) {
        arrival = input;
      }
    }
    if (n == 0) {
      if (arrival < 0) e.stuck();
      now = arrival;
      continue;
    }
    const double factor = e.costs().slowdown_at(n);
    int first = -1;
    for (int w = 0; w < e.workers(); ++w) {
      if (busy[w] && (first < 0 || running[w].left < running[first].left)) first = w;
    }
    double step = running[first].left * factor;
    if (arrival >= 0 && arrival - now < step) step = arrival - now, first = -1;
    now += step;
    for (int w = 0; w < e.workers(); ++w) {
      if (!busy[w]) continue;
      running[w].left -= step / factor;
      if (w == first || running[w].left <= 1e-12 * (now - running[w].start)) {
        e.finish(w, running[w].start, now);
        busy[w] = false;
      }
    }
  }
  return e.result();
}

}  // namespace

Simulation simulate(const Schedule& s, const StageCosts& costs) {
  Engine engine(s, costs);
  return costs.slowdown.empty() ? run_in_turn(engine) : run_sharing(engine);
}

}  // namespace conveyor::schedules
