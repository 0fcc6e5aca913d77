#include "schedules/sharding.h"

#include "schedules/validate.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <tuple>

namespace conveyor::schedules {

const char* shard_level_name(ShardLevel level) {
  const auto names = value_names(level);
  const auto i = static_cast<size_t>(level);
  return i < names.size() ? names[i] : "unknown";
}

ShardLevel shard_level_named(const std::string& name) {
  std::string known;
  const auto names = value_names(ShardLevel{});
  for (size_t i = 0; i < names.size(); ++i) {
    if (name == names[i]) return static_cast<ShardLevel>(i);
    known += std::string(known.empty() ? "" : ", ") + "'" + names[i] + "'";
  }
  throw std::invalid_argument("unknown sharding level '" + name + "' (known: " + known + ")");
}

namespace {

[[noreturn]] void fail(const std::string& message) { throw ScheduleError("invalid schedule: " + message); }

// The actions that make a stage's weight gradients: a whole backward, or the W of a split one.
bool makes_gradient(ActionKind kind) { return kind == ActionKind::kBackward || kind == ActionKind::kWeight; }

std::string where(const ShardAction& a, int worker, size_t position) {
  return "sharding action " + a.str() + " (worker " + std::to_string(worker) + ", before position " +
         std::to_string(position) + ")";
}

void check_placement(const Schedule& s) {
  if (static_cast<int>(s.sharding.size()) != s.num_workers()) {
    fail("sharding actions are given for " + std::to_string(s.sharding.size()) + " workers, the schedule has " +
         std::to_string(s.num_workers()));
  }
  for (int w = 0; w < s.num_workers(); ++w) {
    size_t last = 0;
    for (const Schedule::PlacedShard& p : s.sharding[w]) {
      if (p.position > s.workers[w].size() || p.position < last) {
        fail(where(p.action, w, p.position) + " is out of order or past the end of its line");
      }
      last = p.position;
      if (p.action.stage < 0 || p.action.stage >= s.num_stages) {
        fail(where(p.action, w, p.position) + ": stage out of range [0, " + std::to_string(s.num_stages) + ")");
      }
      if (s.worker_of(p.action.stage) != w) {
        fail(where(p.action, w, p.position) + " is listed for worker " + std::to_string(w) + ", but stage " +
             std::to_string(p.action.stage) + " runs on worker " + std::to_string(s.worker_of(p.action.stage)));
      }
    }
  }
}

}  // namespace

std::string first_sharding_action(const Schedule& s) {
  for (size_t w = 0; w < s.sharding.size(); ++w) {
    if (!s.sharding[w].empty()) return s.sharding[w].front().action.str() + " on worker " + std::to_string(w);
  }
  return "";
}

void check_sharding(const Schedule& s) {
  if (!s.has_sharding()) return;
  check_placement(s);
  if (!s.synchronous()) {
    fail("it has sharding actions, which only a synchronous schedule (step=batch) may: an update per micro-batch "
         "leaves no step to gather or reduce for");
  }
  if (!s.barriers.empty()) fail("it has sharding actions and lock-step barriers, which no schedule shards with");
  struct Stage {
    bool gathers = false, reduces = false, gathered = false;
    int made = 0, pending = 0;  // gradients made, and made since the last REDUCE_GRAD
    Action last;                // the last of them
  };
  std::vector<Stage> st(s.num_stages);
  for (const auto& line : s.sharding) {
    for (const Schedule::PlacedShard& p : line) {
      (p.action.kind == ShardKind::kReduceGrad ? st[p.action.stage].reduces : st[p.action.stage].gathers) = true;
    }
  }
  for (int w = 0; w < s.num_workers(); ++w) {
    const auto& shards = s.sharding[w];
    size_t next = 0;
    for (size_t i = 0; i <= s.workers[w].size(); ++i) {
      for (; next < shards.size() && shards[next].position == i; ++next) {
        const ShardAction& a = shards[next].action;
        Stage& stage = st[a.stage];
        const std::string k = std::to_string(a.stage);
        switch (a.kind) {
          case ShardKind::kUnshard:
            if (stage.gathered) fail(where(a, w, i) + ": stage " + k + "'s parameters are gathered already");
            stage.gathered = true;
            break;
          case ShardKind::kReshard:
            if (!stage.gathered) fail(where(a, w, i) + ": stage " + k + "'s parameters are not gathered");
            stage.gathered = false;
            break;
          case ShardKind::kReduceGrad:
            if (stage.pending == 0) {
              fail(where(a, w, i) + ": stage " + k + " has made no gradient since " +
                   (stage.made == 0 ? "the step began" : "its last REDUCE_GRAD"));
            }
            stage.pending = 0;
            break;
        }
      }
      if (i == s.workers[w].size()) break;
      const Action& a = s.workers[w][i];
      Stage& stage = st[a.stage];
      if (stage.gathers && !stage.gathered) {
        fail("action " + a.str() + " (worker " + std::to_string(w) + ", position " + std::to_string(i) +
             ") runs while stage " + std::to_string(a.stage) +
             "'s parameters are sharded: an UNSHARD must come before it");
      }
      if (makes_gradient(a.kind)) ++stage.made, ++stage.pending, stage.last = a;
    }
  }
  for (int k = 0; k < s.num_stages; ++k) {
    if (st[k].gathered) {
      fail("stage " + std::to_string(k) + " ends the step with its parameters gathered: a RESHARD must follow its "
           "last action");
    }
    if (st[k].reduces && st[k].pending > 0) {
      fail("stage " + std::to_string(k) + "'s gradient from " + st[k].last.str() +
           " is never reduced: a REDUCE_GRAD must follow it");
    }
  }
}

Schedule place_sharding(const Schedule& s, const std::vector<StageSharding>& per_stage) {
  if (per_stage.size() != 1 && static_cast<int>(per_stage.size()) != s.num_stages) {
    throw ScheduleError("place_sharding: " + std::to_string(per_stage.size()) + " stage settings for " +
                        std::to_string(s.num_stages) + " stages (give one for all, or one per stage)");
  }
  if (s.has_sharding()) throw ScheduleError("place_sharding: schedule '" + s.name + "' has sharding actions already");
  validate(s, {.channel_capacity = 1 << 20, .require_backward = false});  // the compute as given
  if (!s.synchronous() || !s.barriers.empty()) {
    throw ScheduleError("place_sharding: schedule '" + s.name + "' steps per micro-batch; only a synchronous "
                        "schedule (step=batch) shards");
  }
  // At one position: free first (the memory comes back before another stage
  // gathers), then reduce, then gather.
  const auto order = [](ShardKind kind) { return kind == ShardKind::kReshard ? 0 : kind == ShardKind::kReduceGrad ? 1 : 2; };
  Schedule out = s;
  out.sharding.assign(s.num_workers(), {});
  for (int w = 0; w < s.num_workers(); ++w) {
    const auto& line = s.workers[w];
    std::vector<std::tuple<size_t, int, int, ShardKind>> placed;  // (position, order, stage, kind), to be sorted
    const auto put = [&](size_t position, int stage, ShardKind kind) {
      placed.emplace_back(position, order(kind), stage, kind);
    };
    for (int k = 0; k < s.num_stages; ++k) {
      if (s.worker_of(k) != w) continue;
      const StageSharding& how = per_stage.size() == 1 ? per_stage[0] : per_stage[k];
      size_t last_gradient = line.size();
      for (size_t i = 0; i < line.size(); ++i) {
        if (line[i].stage != k) continue;
        const bool starts_run = i == 0 || line[i - 1].stage != k, ends_run = i + 1 == line.size() || line[i + 1].stage != k;
        if (how.level == ShardLevel::kParameters && how.regather) {
          if (starts_run) put(i, k, ShardKind::kUnshard);
          if (ends_run) put(i + 1, k, ShardKind::kReshard);
        }
        if (makes_gradient(line[i].kind)) {
          if (how.reduce_per_microbatch) put(i + 1, k, ShardKind::kReduceGrad);
          last_gradient = i;
        }
      }
      if (how.level == ShardLevel::kParameters && !how.regather) {
        const auto first = std::find_if(line.begin(), line.end(), [&](const Action& a) { return a.stage == k; });
        const auto last = std::find_if(line.rbegin(), line.rend(), [&](const Action& a) { return a.stage == k; });
        put(static_cast<size_t>(first - line.begin()), k, ShardKind::kUnshard);
        put(static_cast<size_t>(line.rend() - last), k, ShardKind::kReshard);
      }
      if (!how.reduce_per_microbatch && last_gradient < line.size()) put(last_gradient + 1, k, ShardKind::kReduceGrad);
    }
    std::sort(placed.begin(), placed.end());
    for (const auto& [position, rank, stage, kind] : placed) out.sharding[w].push_back({position, ShardAction{stage, kind}});
  }
  if (!out.has_sharding()) out.sharding.clear();  // nothing to reduce (a forward-only schedule)
  check_sharding(out);
  return out;
}

}  // namespace conveyor::schedules
