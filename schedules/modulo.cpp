#include "schedules/modulo.h"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace conveyor::schedules {

namespace {

constexpr double kRingEps = 1e-9;

// One worker's busy time modulo the interval.
class Ring {
 public:
  explicit Ring(double period) : period_(period) {}

  // The earliest start at or after `ready` where `length` overlaps nothing
  // already placed; nullopt when no gap is long enough.
  std::optional<double> earliest(double ready, double length) const {
    std::vector<double> starts = {ready};
    for (const auto& [at, len] : busy_) starts.push_back(ready + wrap(at + len - ready));
    std::sort(starts.begin(), starts.end());
    for (const double t : starts) {
      if (fits(t, length)) return t;
    }
    return std::nullopt;
  }
  void take(double start, double length) { busy_.emplace_back(wrap(start), length); }

 private:
  double wrap(double x) const { return x - period_ * std::floor(x / period_); }
  bool fits(double t, double length) const {
    if (length > period_ + kRingEps) return false;
    for (const auto& [at, len] : busy_) {
      // [t, t + length) and [at, at + len) on a circle: apart when each
      // starts no earlier than the other ends.
      const double ahead = wrap(at - t), behind = wrap(t - at);
      if (ahead < length - kRingEps || behind < len - kRingEps) {
        if (!(len <= kRingEps && length <= kRingEps)) return false;
      }
    }
    return true;
  }

  double period_;
  std::vector<std::pair<double, double>> busy_;  // start modulo the period, length
};

}  // namespace

double modulo_interval(const SynthesisProblem& p, const std::vector<int>& placement) {
  std::vector<double> load(p.workers, 0);
  for (size_t s = 0; s < placement.size(); ++s) load[placement[s]] += p.forward[s] + p.input[s] + p.weight[s];
  return *std::max_element(load.begin(), load.end());
}

namespace {

// One micro-batch's start times, per stage.
struct Pattern {
  std::vector<double> f_at, i_at, w_at;
};

// Each action as early as its input allows where it finds a gap; nullopt
// when one finds none.
std::optional<Pattern> place_pattern(const SynthesisProblem& p, const std::vector<int>& placement, double interval,
                                     bool weights_last) {
  const int stages = static_cast<int>(placement.size());
  const auto link = [&](int s) {
    if (placement[s] == placement[s + 1]) return 0.0;
    return p.transfers.empty() ? p.latency : p.transfers.at(static_cast<size_t>(s));
  };
  std::vector<Ring> rings(p.workers, Ring(interval));
  Pattern out{std::vector<double>(stages), std::vector<double>(stages), std::vector<double>(stages)};
  const auto place = [&](int s, double ready, double cost, std::vector<double>& at) {
    const std::optional<double> t = rings[placement[s]].earliest(ready, cost);
    if (t) rings[placement[s]].take(*t, cost), at[s] = *t;
    return t.has_value();
  };
  for (int s = 0; s < stages; ++s) {
    const double ready = s == 0 ? 0 : out.f_at[s - 1] + p.forward[s - 1] + link(s - 1);
    if (!place(s, ready, p.forward[s], out.f_at)) return std::nullopt;
  }
  const auto weight = [&](int s) { return place(s, out.i_at[s] + p.input[s], p.weight[s], out.w_at); };
  for (int s = stages - 1; s >= 0; --s) {
    const double ready =
        s + 1 == stages ? out.f_at[s] + p.forward[s] : out.i_at[s + 1] + p.input[s + 1] + link(s);
    if (!place(s, ready, p.input[s], out.i_at)) return std::nullopt;
    if (!weights_last && !weight(s)) return std::nullopt;
  }
  for (int s = stages - 1; weights_last && s >= 0; --s) {
    if (!weight(s)) return std::nullopt;
  }
  return out;
}

}  // namespace

std::optional<Schedule> modulo_schedule(const SynthesisProblem& p, const std::vector<int>& placement, double interval,
                                        bool weights_last) {
  if (!(interval > 0)) return std::nullopt;
  const int stages = static_cast<int>(placement.size());
  const std::optional<Pattern> pattern = place_pattern(p, placement, interval, weights_last);
  if (!pattern) return std::nullopt;

  Schedule out;
  out.name = p.name;
  out.num_stages = stages;
  out.num_microbatches = p.microbatches;
  out.workers.assign(p.workers, {});
  if (p.chunks > 1) out.placement = placement;
  // Per worker: (time, order among equal times, action).
  std::vector<std::vector<std::tuple<double, int, Action>>> lines(p.workers);
  for (int j = 0; j < p.microbatches; ++j) {
    const double shift = interval * j;
    for (int s = 0; s < stages; ++s) {
      auto& line = lines[placement[s]];
      line.emplace_back(pattern->f_at[s] + shift, 0, Action{s, ActionKind::kForward, j});
      line.emplace_back(pattern->i_at[s] + shift, 1, Action{s, ActionKind::kBackwardInput, j});
      line.emplace_back(pattern->w_at[s] + shift, 2, Action{s, ActionKind::kWeight, j});
    }
  }
  for (int w = 0; w < p.workers; ++w) {
    auto& line = lines[w];
    std::sort(line.begin(), line.end(), [](const auto& a, const auto& b) {
      const Action &x = std::get<2>(a), &y = std::get<2>(b);
      return std::tie(std::get<0>(a), std::get<1>(a), x.stage, x.microbatch) <
             std::tie(std::get<0>(b), std::get<1>(b), y.stage, y.microbatch);
    });
    for (const auto& entry : line) out.workers[w].push_back(std::get<2>(entry));
  }
  return out;
}

}  // namespace conveyor::schedules
