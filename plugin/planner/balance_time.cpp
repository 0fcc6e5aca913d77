#include "plugin/planner/balance_time.h"

#include "plugin/core/errors.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace conveyor {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// cuttable[b]: whether a stage may begin at layer b (0 < b < L).
std::vector<bool> cut_points(const SplitCosts& c) {
  std::vector<bool> cuttable(c.num_layers + 1, true);
  for (const AtomicGroup& g : c.atomic_groups) {
    check_argument(g.first >= 0 && g.last < c.num_layers && g.first <= g.last, "conveyor: atomic group [", g.first,
                   ", ", g.last, "] is not a range of layers of a model of ", c.num_layers,
                   " layers (first <= last < ", c.num_layers, ")");
    for (int64_t b = g.first + 1; b <= g.last; ++b) cuttable[b] = false;
  }
  return cuttable;
}

// The classic min-max DP over contiguous splits: cost(k, a, b) of stage k
// holding [a, b), infinite where not allowed. Returns the best value and the
// split points (empty when nothing is finite).
std::pair<double, std::vector<int64_t>> min_max_split(int64_t n, int num_stages, const std::vector<bool>& cuttable,
                                                      const std::function<double(int, int64_t, int64_t)>& cost) {
  std::vector<std::vector<double>> best(num_stages + 1, std::vector<double>(n + 1, kInf));
  std::vector<std::vector<int64_t>> split(num_stages + 1, std::vector<int64_t>(n + 1, 0));
  best[0][0] = -kInf;
  for (int k = 1; k <= num_stages; ++k) {
    for (int64_t i = k; i <= n; ++i) {
      if (i < n && !cuttable[i]) continue;
      for (int64_t s = k - 1; s < i; ++s) {
        if (best[k - 1][s] == kInf || (s > 0 && !cuttable[s])) continue;
        const double value = std::max(best[k - 1][s], cost(k - 1, s, i));
        if (value < best[k][i]) {
          best[k][i] = value;
          split[k][i] = s;
        }
      }
    }
  }
  if (best[num_stages][n] == kInf) return {kInf, {}};
  std::vector<int64_t> boundaries(num_stages - 1);
  int64_t i = n;
  for (int k = num_stages; k > 1; --k) {
    i = split[k][i];
    boundaries[k - 2] = i;
  }
  return {best[num_stages][n], boundaries};
}

std::string layers_text(const SplitCosts& c, int64_t begin, int64_t end) {
  std::ostringstream os;
  if (end - begin == 1) {
    os << "layer " << begin;
  } else {
    os << "layers [" << begin << ", " << end << ")";
  }
  if (static_cast<int64_t>(c.layer_names.size()) >= end) {
    os << " (";
    for (int64_t i = begin; i < end; ++i) os << (i > begin ? ", " : "") << c.layer_names[i];
    os << ")";
  }
  return os.str();
}

// Why no split fits: the smallest unit that fits no stage's budget, else the
// split whose worst excess is least, naming its worst stage.
[[noreturn]] void explain_over_budget(const SplitCosts& c, int num_stages, const std::vector<bool>& cuttable) {
  for (int64_t a = 0; a < c.num_layers;) {
    int64_t b = a + 1;
    while (b < c.num_layers && !cuttable[b]) ++b;
    int64_t least_excess = std::numeric_limits<int64_t>::max();
    int where = 0;
    for (int k = 0; k < num_stages; ++k) {
      const int64_t excess = c.bytes(k, a, b) - c.budgets[k];
      if (excess < least_excess) least_excess = excess, where = k;
    }
    if (least_excess > 0) {
      throw std::invalid_argument(c10::str("conveyor: ", layers_text(c, a, b), b - a > 1 ? ", an atomic group," : "",
                                           " does not fit any device's memory budget: on its own it needs ",
                                           bytes_text(least_excess), " more than stage ", where, "'s budget of ",
                                           bytes_text(c.budgets[where])));
    }
    a = b;
  }
  const auto excess = [&](int k, int64_t a, int64_t b) { return static_cast<double>(c.bytes(k, a, b) - c.budgets[k]); };
  const auto [worst, boundaries] = min_max_split(c.num_layers, num_stages, cuttable, excess);
  int64_t begin = 0;
  for (int k = 0; k < num_stages; ++k) {
    const int64_t end = k + 1 < num_stages ? boundaries[k] : c.num_layers;
    if (excess(k, begin, end) == worst) {
      throw std::invalid_argument(c10::str("conveyor: no split into ", num_stages,
                                           " stages fits the memory budgets; the closest puts ",
                                           layers_text(c, begin, end), " on stage ", k, ", ",
                                           bytes_text(static_cast<int64_t>(worst)), " over its budget of ",
                                           bytes_text(c.budgets[k])));
    }
    begin = end;
  }
  throw std::invalid_argument("conveyor: no split fits the memory budgets");
}

}  // namespace

std::string bytes_text(int64_t bytes) {
  std::ostringstream os;
  os.precision(2);
  os << std::fixed << static_cast<double>(bytes) / (1024.0 * 1024.0) << " MiB (" << bytes << " bytes)";
  return os.str();
}

std::vector<int64_t> time_balanced_boundaries(const SplitCosts& c, int num_stages) {
  if (num_stages < 1) throw std::invalid_argument("conveyor: the number of stages must be positive");
  check_argument(c.budgets.empty() || static_cast<int>(c.budgets.size()) == num_stages, "conveyor: ",
                 c.budgets.size(), " memory budgets given for ", num_stages, " stages: give one per stage");
  const std::vector<bool> cuttable = cut_points(c);
  const int64_t units = 1 + std::count(cuttable.begin() + 1, cuttable.begin() + c.num_layers, true);
  check_argument(units >= num_stages, "conveyor: ", num_stages, " stages asked for, but the atomic groups leave only ",
                 units, " units of ", c.num_layers, " layers to place: every stage needs at least one");
  const bool budgeted = !c.budgets.empty();
  const auto cost = [&](int k, int64_t a, int64_t b) {
    if (budgeted && c.bytes(k, a, b) > c.budgets[k]) return kInf;
    return c.seconds(k, a, b);
  };
  auto [value, boundaries] = min_max_split(c.num_layers, num_stages, cuttable, cost);
  if (value == kInf) explain_over_budget(c, num_stages, cuttable);
  return boundaries;
}

double bottleneck_seconds(const SplitCosts& c, const std::vector<int64_t>& boundaries) {
  double worst = 0;
  int64_t begin = 0;
  const int num_stages = static_cast<int>(boundaries.size()) + 1;
  for (int k = 0; k < num_stages; ++k) {
    const int64_t end = k + 1 < num_stages ? boundaries[k] : c.num_layers;
    worst = std::max(worst, c.seconds(k, begin, end));
    begin = end;
  }
  return worst;
}

}  // namespace conveyor
