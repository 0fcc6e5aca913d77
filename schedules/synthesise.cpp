#include "schedules/synthesise.h"

#include "schedules/generators.h"
#include "schedules/modulo.h"
#include "schedules/v_shape.h"
#include "schedules/validate.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>

namespace conveyor::schedules {

namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

struct Policy {
  bool eager_weight;   // a W runs whenever nothing else can start now; else only where it delays nothing
  bool forward_first;  // an F before an I that could start as early
  bool deep_first;     // among F's, the later stage first (a V's second chunk)
  const char* name;
};

constexpr Policy kPolicies[] = {
    {false, false, false, "greedy: I first, W in gaps"},
    {false, false, true, "greedy: I first, W in gaps, deep F first"},
    {true, false, false, "greedy: I first, W eager"},
    {true, false, true, "greedy: I first, W eager, deep F first"},
    {false, true, false, "greedy: F first, W in gaps"},
    {false, true, true, "greedy: F first, W in gaps, deep F first"},
    {true, true, false, "greedy: F first, W eager"},
    {true, true, true, "greedy: F first, W eager, deep F first"},
};

double at_or(const std::vector<double>& v, int i, double fallback) {
  return v.empty() ? fallback : v.at(static_cast<size_t>(i));
}

// Stage -> worker: a V for 2 chunks, else stage k on worker k.
std::vector<int> placement_of(const SynthesisProblem& p) {
  if (p.chunks == 2) return v_placement(p.workers);
  std::vector<int> identity;
  for (int s = 0; s < p.workers; ++s) identity.push_back(s);
  return identity;
}

// One pass of list scheduling under one policy; nullopt when it gets stuck
// (the cap or the channels leave no action to run).
class Greedy {
 public:
  Greedy(const SynthesisProblem& p, const std::vector<int>& placement, Policy policy)
      : p_(p), policy_(policy), placement_(placement), stages_(static_cast<int>(placement.size())),
        m_(p.microbatches) {
    f_next_.assign(stages_, 0);
    i_next_.assign(stages_, 0);
    waiting_w_.assign(stages_, {});
    f_done_.assign(stages_, std::vector<double>(m_, -1));
    i_done_.assign(stages_, std::vector<double>(m_, -1));
    free_at_.assign(p.workers, 0);
    held_.assign(p.workers, 0);
    first_stage_.assign(p.workers, stages_);
    total_.assign(p.workers, 0);
    for (int s = 0; s < stages_; ++s) {
      const int w = placement_[s];
      first_stage_[w] = std::min(first_stage_[w], s);
      total_[w] += activation(s);
    }
  }

  std::optional<Schedule> run() {
    Schedule out;
    out.name = p_.name;
    out.num_stages = stages_;
    out.num_microbatches = m_;
    out.workers.assign(p_.workers, {});
    if (p_.chunks > 1) out.placement = placement_;
    for (long left = 3L * stages_ * m_; left > 0; --left) {
      std::optional<Choice> best;
      for (int w = 0; w < p_.workers; ++w) {
        const std::optional<Choice> c = choose(w, /*forced=*/false);
        if (c && (!best || c->start < best->start)) best = c;
      }
      if (!best) {  // only postponed W's are left to run: the earliest of them
        for (int w = 0; w < p_.workers; ++w) {
          const std::optional<Choice> c = choose(w, /*forced=*/true);
          if (c && (!best || c->start < best->start)) best = c;
        }
      }
      if (!best) return std::nullopt;
      commit(*best, out);
    }
    return out;
  }

 private:
  struct Choice {
    Action action;
    double start = 0;
  };

  double activation(int s) const { return at_or(p_.activation, s, 1.0); }
  double cost(const Action& a) const {
    switch (a.kind) {
      case ActionKind::kForward: return p_.forward[a.stage];
      case ActionKind::kBackwardInput: return p_.input[a.stage];
      default: return p_.weight[a.stage];
    }
  }
  double link(int s) const { return placement_[s] == placement_[s + 1] ? 0 : at_or(p_.transfers, s, p_.latency); }
  // A micro-batch enters worker w (its first stage there) only while the
  // worker could still take its later chunks too, so one of them always has
  // room; a later chunk's F needs only its own room.
  bool fits(int w, int s) const {
    const double need = s == first_stage_[w] ? total_[w] : activation(s);
    return p_.memory_cap <= 0 || held_[w] + need <= p_.memory_cap + 1e-9;
  }

  // The action worker w runs next and when it could start; a W that would
  // delay an I or F is postponed unless `forced`.
  std::optional<Choice> choose(int w, bool forced) const {
    std::optional<Choice> input, forward, weight;
    bool memory_bound = false;  // an F is ready but does not fit: a W would make room
    for (int s = 0; s < stages_; ++s) {
      if (placement_[s] != w) continue;
      const int f = f_next_[s];
      const bool arrived = f < m_ && (s == 0 || f_done_[s - 1][f] >= 0);
      if (arrived && !fits(w, s)) memory_bound = true;
      if (arrived && fits(w, s) && (s + 1 == stages_ || f_next_[s] - f_next_[s + 1] < p_.channel_capacity)) {
        const double ready = s == 0 ? 0 : f_done_[s - 1][f] + link(s - 1);
        const Choice c{{s, ActionKind::kForward, f}, std::max(free_at_[w], ready)};
        if (!forward || c.start < forward->start ||
            (c.start == forward->start && (policy_.deep_first ? s > forward->action.stage : f < forward->action.microbatch))) {
          forward = c;
        }
      }
      const int i = i_next_[s];
      if (i < f_next_[s] && (s + 1 == stages_ || i_done_[s + 1][i] >= 0) &&
          (s == 0 || i_next_[s] - i_next_[s - 1] < p_.channel_capacity)) {
        const double ready = std::max(f_done_[s][i], s + 1 == stages_ ? 0.0 : i_done_[s + 1][i] + link(s));
        const Choice c{{s, ActionKind::kBackwardInput, i}, std::max(free_at_[w], ready)};
        if (!input || c.start < input->start || (c.start == input->start && s > input->action.stage)) input = c;
      }
      if (!waiting_w_[s].empty()) {
        const int mb = waiting_w_[s].front();
        const Choice c{{s, ActionKind::kWeight, mb}, std::max(free_at_[w], i_done_[s][mb])};
        if (!weight || c.start < weight->start) weight = c;
      }
    }
    std::optional<Choice> main = input;
    if (forward && (!main || forward->start < main->start || (forward->start == main->start && policy_.forward_first))) {
      main = forward;
    }
    if (!weight) return main;
    const bool eager = policy_.eager_weight || memory_bound;
    if (!main) {
      // Nothing else can run yet: eager runs the W now, lazy only when forced.
      if (eager || forced) return weight;
      return std::nullopt;
    }
    const bool gap = eager ? weight->start < main->start : weight->start + cost(weight->action) <= main->start;
    return gap ? weight : main;
  }

  void commit(const Choice& c, Schedule& out) {
    const Action& a = c.action;
    const int w = placement_[a.stage];
    const double end = c.start + cost(a);
    free_at_[w] = end;
    out.workers[w].push_back(a);
    switch (a.kind) {
      case ActionKind::kForward:
        held_[w] += activation(a.stage);
        f_done_[a.stage][a.microbatch] = end;
        ++f_next_[a.stage];
        break;
      case ActionKind::kBackwardInput:
        i_done_[a.stage][a.microbatch] = end;
        ++i_next_[a.stage];
        waiting_w_[a.stage].push_back(a.microbatch);
        break;
      default:
        held_[w] -= activation(a.stage);
        waiting_w_[a.stage].pop_front();
        break;
    }
  }

  const SynthesisProblem& p_;
  Policy policy_;
  std::vector<int> placement_;
  int stages_, m_;
  std::vector<int> f_next_, i_next_, first_stage_;
  std::vector<std::deque<int>> waiting_w_;
  std::vector<std::vector<double>> f_done_, i_done_;
  std::vector<double> free_at_, held_, total_;
};

void check_problem(const SynthesisProblem& p) {
  const auto fail = [](const std::string& what) { throw std::invalid_argument("schedule synthesis: " + what); };
  if (p.workers < 1) fail("needs at least 1 worker, got " + std::to_string(p.workers));
  if (p.chunks != 1 && p.chunks != 2) {
    fail("places 1 chunk per worker or 2 in a V, not " + std::to_string(p.chunks));
  }
  if (p.microbatches < 1) fail("needs at least 1 micro-batch, got " + std::to_string(p.microbatches));
  if (p.channel_capacity < 1) fail("needs channels of at least 1 message, got " + std::to_string(p.channel_capacity));
  const size_t stages = static_cast<size_t>(p.workers) * p.chunks;
  const auto sized = [&](const std::vector<double>& v, const char* what, bool optional) {
    if ((optional && v.empty()) || v.size() == stages) {
      for (double x : v) {
        if (!(x >= 0)) fail(std::string(what) + " holds " + std::to_string(x) + ": costs and sizes are >= 0");
      }
      return;
    }
    fail(std::string(what) + " gives " + std::to_string(v.size()) + " stages, the problem has " +
         std::to_string(stages) + " (" + std::to_string(p.workers) + " workers x " + std::to_string(p.chunks) +
         " chunks)");
  };
  sized(p.forward, "forward", false);
  sized(p.input, "input", false);
  sized(p.weight, "weight", false);
  sized(p.activation, "activation", true);
  sized(p.backward, "backward", true);
  if (!p.transfers.empty() && p.transfers.size() + 1 != stages) {
    fail("transfers gives " + std::to_string(p.transfers.size()) + " boundaries, the problem has " +
         std::to_string(stages - 1));
  }
  if (p.memory_cap > 0) {
    const std::vector<int> placement = placement_of(p);
    std::vector<double> need(p.workers, 0);
    for (size_t s = 0; s < stages; ++s) need[placement[s]] += at_or(p.activation, s, 1.0);
    for (int w = 0; w < p.workers; ++w) {
      if (need[w] > p.memory_cap + 1e-9) {
        std::ostringstream os;
        os << "a memory cap of " << p.memory_cap << " per worker cannot hold one micro-batch on worker " << w
           << ", which keeps " << need[w] << " (its stages' activations) until the micro-batch's W";
        fail(os.str());
      }
    }
  }
}

// The fixed families that fit the problem's placement, for the race.
std::vector<std::pair<Schedule, std::string>> fixed_families(const SynthesisProblem& p) {
  std::vector<std::pair<Schedule, std::string>> out;
  const auto add = [&](Schedule s) {
    std::string family = s.name;
    s.name = p.name;
    out.emplace_back(std::move(s), "fixed family " + family);
  };
  if (p.chunks == 1) {
    add(make_sequential(p.workers, p.microbatches));
    add(make_1f1b(p.workers, p.microbatches));
    add(make_zb_h1(p.workers, p.microbatches));
    add(make_gpipe(p.workers, p.microbatches));
  } else if (p.microbatches >= 2 * p.workers) {
    add(make_dualpipev(p.workers, p.microbatches));
  }
  return out;
}

// The caps the greedy passes race at (see synthesise()): from the cap (or
// from what every micro-batch on every chunk of a worker holds, past which a
// cap binds nothing) down by the largest activation, while one still fits.
std::vector<double> race_caps(const SynthesisProblem& p) {
  if (p.memory_cap <= 0 || !p.race_lower_caps) return {p.memory_cap};
  const double step = p.activation.empty() ? 1.0 : *std::max_element(p.activation.begin(), p.activation.end());
  const double top = std::min(p.memory_cap, step * p.microbatches * p.chunks);
  std::vector<double> caps;
  for (double cap = top; cap >= step - 1e-12 && caps.size() < 64; cap -= step) caps.push_back(cap);
  return caps.empty() ? std::vector<double>{p.memory_cap} : caps;
}

}  // namespace

std::vector<int> v_placement(int workers) {
  std::vector<int> placement;
  for (int s = 0; s < 2 * workers; ++s) placement.push_back(s < workers ? s : 2 * workers - 1 - s);
  return placement;
}

StageCosts synthesis_costs(const SynthesisProblem& p) {
  const std::vector<int> placement = placement_of(p);
  StageCosts costs;
  costs.forward = p.forward;
  costs.input = p.input;
  costs.weight = p.weight;
  costs.backward = p.backward;
  if (costs.backward.empty()) {
    for (size_t s = 0; s < p.forward.size(); ++s) costs.backward.push_back(p.input[s] + p.weight[s]);
  }
  for (size_t s = 0; s + 1 < p.forward.size(); ++s) {
    const bool turn = placement[s] == placement[s + 1];
    costs.transfers.push_back(turn ? 0 : at_or(p.transfers, static_cast<int>(s), p.latency));
  }
  return costs;
}

std::vector<double> peak_worker_memory(const Schedule& schedule, const std::vector<double>& activation) {
  std::vector<double> peaks;
  for (const auto& line : schedule.workers) {
    double held = 0, peak = 0;
    for (const Action& a : line) {
      const double size = at_or(activation, a.stage, 1.0);
      if (a.kind == ActionKind::kForward) held += size;
      if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kWeight) held -= size;
      peak = std::max(peak, held);
    }
    peaks.push_back(peak);
  }
  return peaks;
}

Synthesis synthesise(const SynthesisProblem& problem) {
  check_problem(problem);
  const std::vector<int> placement = placement_of(problem);
  const StageCosts costs = synthesis_costs(problem);
  std::optional<Synthesis> best;
  const auto consider = [&](Schedule s, const std::string& method) {
    try {
      validate(s, {problem.channel_capacity, true});
    } catch (const ScheduleError&) {
      return;  // this candidate would deadlock the channels: the others race on
    }
    std::vector<double> peaks = peak_worker_memory(s, problem.activation);
    if (problem.memory_cap > 0 && *std::max_element(peaks.begin(), peaks.end()) > problem.memory_cap + 1e-9) return;
    Simulation sim = simulate(s, costs);
    if (!best || sim.makespan < best->simulation.makespan - 1e-12) {
      best = Synthesis{std::move(s), std::move(sim), std::move(peaks), method};
    }
  };
  // A schedule that fits a lower cap fits this one, and a pass that fills a
  // large cap may start more forwards than pay (each held micro-batch delays
  // a W): the passes race at the cap and at every cap a micro-batch's largest
  // activation lower, so that with caps counted in micro-batches more memory
  // never gives a slower schedule.
  const std::vector<double> caps = race_caps(problem);
  for (const double cap : caps) {
    SynthesisProblem at = problem;
    at.memory_cap = cap;
    for (const Policy& policy : kPolicies) {
      std::string method = policy.name;
      if (cap < problem.memory_cap) method += ", at a cap of " + std::to_string(cap);
      if (std::optional<Schedule> s = Greedy(at, placement, policy).run()) consider(std::move(*s), method);
    }
  }
  // Patterns repeated at the busiest worker's interval and at longer ones,
  // a chunk's action longer each time (a steady bubble for less memory);
  // placed for the problem's costs, and for equal ones (the named V
  // schedules' order: measured costs that differ a little can split a
  // worker's free time into gaps that need a longer interval).
  const SynthesisProblem equal = [&] {
    SynthesisProblem p = problem;
    for (auto* v : {&p.forward, &p.input, &p.weight}) v->assign(v->size(), 1.0);
    p.backward.clear(), p.transfers.clear(), p.latency = 0;
    return p;
  }();
  std::vector<const SynthesisProblem*> placed_for = {&problem};
  if (equal.forward != problem.forward || equal.input != problem.input || equal.weight != problem.weight ||
      problem.latency != 0 || !problem.transfers.empty()) {
    placed_for.push_back(&equal);
  }
  for (const SynthesisProblem* costs : placed_for) {
    const double interval = modulo_interval(*costs, placement);
    const int actions = 3 * problem.chunks;
    for (const bool weights_last : {true, false}) {
      for (int longer = 0; longer <= actions; ++longer) {
        const double every = interval * (1.0 + static_cast<double>(longer) / actions);
        if (std::optional<Schedule> s = modulo_schedule(*costs, placement, every, weights_last)) {
          std::ostringstream method;
          method << "modulo: the pattern " << (costs == &equal ? "of equal costs " : "") << "repeated every " << every
                 << (weights_last ? ", W's last" : ", W after its I");
          consider(std::move(*s), method.str());
        }
      }
    }
  }
  if (problem.race_fixed_families) {
    for (auto& [s, method] : fixed_families(problem)) consider(std::move(s), method);
  }
  if (!best) {
    std::ostringstream os;
    os << "schedule synthesis: no schedule of " << problem.workers << " workers x " << problem.chunks << " chunks and "
       << problem.microbatches << " micro-batches fits a memory cap of " << problem.memory_cap
       << " with channels of " << problem.channel_capacity << " messages; raise the cap";
    throw std::invalid_argument(os.str());
  }
  return std::move(*best);
}

}  // namespace conveyor::schedules
