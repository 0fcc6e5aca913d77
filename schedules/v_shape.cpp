#include "schedules/v_shape.h"

#include "schedules/synthesise.h"

#include <cmath>
#include <deque>
#include <stdexcept>
#include <utility>

namespace conveyor::schedules {

namespace {

void check_v(const char* name, int k, int m) {
  if (k < 1) throw std::invalid_argument(std::string(name) + " needs at least 1 worker, got " + std::to_string(k));
  if (m < 1) throw std::invalid_argument(std::string(name) + " needs at least 1 micro-batch, got " + std::to_string(m));
}

// The V at the named cap, each stage's F, I and W of one unit.
Schedule synthesised_v(const char* name, int k, int m) {
  check_v(name, k, m);
  SynthesisProblem p;
  p.name = name;
  p.workers = k;
  p.chunks = 2;
  p.microbatches = m;
  p.forward.assign(2 * k, 1.0);
  p.input.assign(2 * k, 1.0);
  p.weight.assign(2 * k, 1.0);
  p.memory_cap = v_memory_cap(name, k);
  p.channel_capacity = 1;  // valid at every capacity the pipeline may have
  p.race_lower_caps = false;  // each name is the passes' shape at its own cap
  return synthesise(p).schedule;
}

}  // namespace

double v_memory_cap(const std::string& name, int k) {
  if (name == "zb-v") return 2.0 * k;
  if (name == "v-half") return k + 1.0;
  if (name == "v-min") return std::max(2.0, std::ceil(2.0 * k / 3.0) + 1.0);
  throw std::invalid_argument("no V schedule is called '" + name + "' (zb-v, v-half, v-min, dualpipev)");
}

const std::vector<std::string>& v_shape_names() {
  static const std::vector<std::string> names = {"zb-v", "v-half", "v-min", "dualpipev"};
  return names;
}

Schedule make_v_shape(const std::string& name, int k, int m) {
  if (name == "dualpipev") return make_dualpipev(k, m);
  v_memory_cap(name, k);  // refuses a name that is no V
  return synthesised_v(name.c_str(), k, m);
}

Schedule make_zb_v(int k, int m) { return synthesised_v("zb-v", k, m); }
Schedule make_v_half(int k, int m) { return synthesised_v("v-half", k, m); }
Schedule make_v_min(int k, int m) { return synthesised_v("v-min", k, m); }

Schedule make_dualpipev(int k, int m) {
  check_v("dualpipev", k, m);
  if (m < 2 * k) {
    throw std::invalid_argument("dualpipev on " + std::to_string(k) + " workers needs at least " +
                                std::to_string(2 * k) + " micro-batches (2 per worker), got " + std::to_string(m));
  }
  Schedule s;
  s.name = "dualpipev";
  s.num_stages = 2 * k;
  s.num_microbatches = m;
  s.placement = v_placement(k);
  s.workers.assign(k, {});
  for (int r = 0; r < k; ++r) {
    const int chunk_stage[2] = {r, 2 * k - 1 - r};
    int next_f[2] = {0, 0}, next_b[2] = {0, 0};
    std::deque<std::pair<int, int>> weights;  // (stage, micro-batch) of I's whose W is still to run
    auto& line = s.workers[r];
    const auto forward = [&](int c) { line.push_back({chunk_stage[c], ActionKind::kForward, next_f[c]++}); };
    // A whole backward, or an I whose W waits in `weights`.
    const auto backward = [&](int c, bool split) {
      const int mb = next_b[c]++;
      line.push_back({chunk_stage[c], split ? ActionKind::kBackwardInput : ActionKind::kBackward, mb});
      if (split) weights.emplace_back(chunk_stage[c], mb);
    };
    const auto weight = [&] {
      line.push_back({weights.front().first, ActionKind::kWeight, weights.front().second});
      weights.pop_front();
    };
    const int later = k - 1 - r;  // workers after this one
    for (int i = 0; i < 2 * later; ++i) forward(0);                 // warm-up: first chunk only
    for (int i = 0; i <= r; ++i) forward(0), forward(1);           // both chunks
    for (int i = 0; i < later; ++i) backward(1, true), weight(), forward(1);
    for (int i = 0; i < m - 2 * k + r + 1; ++i) {                  // steady: F of one chunk, B of the other
      forward(0), backward(1, false);
      forward(1), backward(0, false);
    }
    for (int i = 0; i < later; ++i) backward(1, false), forward(1), backward(0, false);
    bool split = false;  // the cool-down's second half defers its weight gradients
    for (int i = 0; i <= r; ++i) {
      if (i == (r + 1) / 2 && r % 2 == 1) split = true;
      backward(1, split);
      if (i == (r + 1) / 2 && r % 2 == 0) split = true;
      backward(0, split);
    }
    for (int i = 0; i < later; ++i) weight(), backward(0, true);
    while (!weights.empty()) weight();
  }
  return s;
}

}  // namespace conveyor::schedules
