#include "schedules/generators.h"

#include <algorithm>
#include <cctype>
#include <stdexcept>

namespace conveyor::schedules {

namespace {

Schedule empty(const char* name, int k, int m) {
  if (k < 1) throw std::invalid_argument("a schedule needs at least 1 stage, got " + std::to_string(k));
  if (m < 1) throw std::invalid_argument("a schedule needs at least 1 micro-batch, got " + std::to_string(m));
  Schedule s;
  s.name = name;
  s.num_stages = k;
  s.num_microbatches = m;
  s.stages.resize(k);
  return s;
}

Action F(int stage, int mb) { return {stage, ActionKind::kForward, mb}; }
Action B(int stage, int mb) { return {stage, ActionKind::kBackward, mb}; }

}  // namespace

Schedule make_sequential(int num_stages, int num_microbatches) {
  Schedule s = empty("sequential", num_stages, num_microbatches);
  for (int k = 0; k < num_stages; ++k) {
    for (int mb = 0; mb < num_microbatches; ++mb) {
      s.stages[k].push_back(F(k, mb));
      s.stages[k].push_back(B(k, mb));
    }
  }
  return s;
}

Schedule make_gpipe(int num_stages, int num_microbatches) {
  Schedule s = empty("gpipe", num_stages, num_microbatches);
  for (int k = 0; k < num_stages; ++k) {
    for (int mb = 0; mb < num_microbatches; ++mb) s.stages[k].push_back(F(k, mb));
    for (int mb = 0; mb < num_microbatches; ++mb) s.stages[k].push_back(B(k, mb));
  }
  return s;
}

Schedule make_1f1b(int num_stages, int num_microbatches) {
  Schedule s = empty("1f1b", num_stages, num_microbatches);
  for (int k = 0; k < num_stages; ++k) {
    const int warmup = std::min(num_microbatches, num_stages - k - 1);
    int next_f = 0, next_b = 0;
    while (next_f < warmup) s.stages[k].push_back(F(k, next_f++));
    while (next_f < num_microbatches) {
      s.stages[k].push_back(F(k, next_f++));
      s.stages[k].push_back(B(k, next_b++));
    }
    while (next_b < num_microbatches) s.stages[k].push_back(B(k, next_b++));
  }
  return s;
}

Schedule make_forward_only(int num_stages, int num_microbatches) {
  Schedule s = empty("forward", num_stages, num_microbatches);
  for (int k = 0; k < num_stages; ++k) {
    for (int mb = 0; mb < num_microbatches; ++mb) s.stages[k].push_back(F(k, mb));
  }
  return s;
}

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names = {"sequential", "gpipe", "1f1b"};
  return names;
}

Schedule make_schedule(const std::string& name, int num_stages, int num_microbatches) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "sequential") return make_sequential(num_stages, num_microbatches);
  if (lower == "gpipe") return make_gpipe(num_stages, num_microbatches);
  if (lower == "1f1b") return make_1f1b(num_stages, num_microbatches);
  std::string known;
  for (const auto& n : schedule_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown schedule '" + name + "' (known: " + known + ")");
}

}  // namespace conveyor::schedules
