#include "schedules/validate.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace conveyor::schedules {

namespace {

std::string where(const Action& a, int position) {
  std::ostringstream os;
  os << "action " << a.str() << " (stage " << a.stage << ", position " << position << ", " << kind_name(a.kind)
     << " of micro-batch " << a.microbatch << ")";
  return os.str();
}

[[noreturn]] void fail(const std::string& message) { throw ScheduleError("invalid schedule: " + message); }

void check_shape(const Schedule& s) {
  if (s.num_stages < 1) fail("it has " + std::to_string(s.num_stages) + " stages");
  if (s.num_microbatches < 1) fail("it has " + std::to_string(s.num_microbatches) + " micro-batches");
  if (static_cast<int>(s.stages.size()) != s.num_stages) {
    fail("it declares " + std::to_string(s.num_stages) + " stages but lists actions for " +
         std::to_string(s.stages.size()));
  }
}

// Per stage: each action in range, once, and every backward after its forward.
void check_actions(const Schedule& s, bool require_backward) {
  for (int k = 0; k < s.num_stages; ++k) {
    std::set<int> forwarded, backwarded;
    for (int i = 0; i < static_cast<int>(s.stages[k].size()); ++i) {
      const Action& a = s.stages[k][i];
      if (a.stage != k) fail(where(a, i) + " is listed for stage " + std::to_string(k));
      if (a.microbatch < 0 || a.microbatch >= s.num_microbatches) {
        fail(where(a, i) + ": micro-batch out of range [0, " + std::to_string(s.num_microbatches) + ")");
      }
      std::set<int>& done = a.kind == ActionKind::kForward ? forwarded : backwarded;
      if (!done.insert(a.microbatch).second) fail(where(a, i) + " is repeated");
      if (a.kind == ActionKind::kBackward && !forwarded.count(a.microbatch)) {
        fail(where(a, i) + ": backward before its forward " + Action{k, ActionKind::kForward, a.microbatch}.str());
      }
    }
    for (int mb = 0; mb < s.num_microbatches; ++mb) {
      if (!forwarded.count(mb)) {
        fail("stage " + std::to_string(k) + " never runs the forward of micro-batch " + std::to_string(mb) +
             " (no action " + Action{k, ActionKind::kForward, mb}.str() + ")");
      }
      if (require_backward && !backwarded.count(mb)) {
        fail("stage " + std::to_string(k) + " never runs the backward of micro-batch " + std::to_string(mb) +
             " (no action " + Action{k, ActionKind::kBackward, mb}.str() + ")");
      }
    }
  }
}

// Replays the schedule under the runtime's blocking rules: an action first
// receives (forward: the activation from k-1; backward: the gradient from
// k+1), then sends (forward to k+1, backward to k-1). A send waits while the
// channel holds `capacity` undelivered messages; with capacity 0 it also
// waits until its message is taken. If no stage can move and some have
// actions left, the schedule deadlocks.
class BlockingReplay {
 public:
  BlockingReplay(const Schedule& s, int capacity) : s_(s), capacity_(capacity), state_(s.num_stages) {}

  void run() {
    bool progressed = true;
    while (progressed) {
      progressed = false;
      for (int k = 0; k < s_.num_stages; ++k) {
        while (step(k)) progressed = true;
      }
      progressed = pass_barrier() || progressed;
    }
    std::ostringstream stuck;
    for (int k = 0; k < s_.num_stages; ++k) {
      const bool barrier = at_barrier(k);
      if (!barrier && state_[k].pc >= s_.stages[k].size()) continue;
      stuck << (stuck.tellp() > 0 ? "; " : "") << "stage " << k;
      if (barrier) {
        stuck << " waits at barrier " << state_[k].barriers_passed << " for the other stages";
      } else {
        stuck << " blocks at " << s_.stages[k][state_[k].pc].str() << " " << waiting_for(k);
      }
    }
    if (stuck.tellp() > 0) {
      fail("it deadlocks under blocking transfers with channel capacity " + std::to_string(capacity_) + ": " +
           stuck.str());
    }
  }

 private:
  enum class Phase { kReceive, kSend, kAwaitTake };
  struct StageState {
    size_t pc = 0;
    Phase phase = Phase::kReceive;
    size_t barriers_passed = 0;
  };

  // True when stage k's next move is to wait at its next barrier.
  bool at_barrier(int k) const {
    const StageState& st = state_[k];
    return !s_.barriers.empty() && st.barriers_passed < s_.barriers[k].size() &&
           s_.barriers[k][st.barriers_passed] == st.pc && st.phase == Phase::kReceive;
  }

  // Lets every stage through its next barrier once all stand at it.
  bool pass_barrier() {
    if (s_.barriers.empty()) return false;
    for (int k = 0; k < s_.num_stages; ++k) {
      if (!at_barrier(k)) return false;
    }
    for (auto& st : state_) ++st.barriers_passed;
    return true;
  }
  // A channel: (from, to, is_gradient) -> undelivered micro-batches.
  using Key = std::tuple<int, int, bool>;

  bool forward(const Action& a) const { return a.kind == ActionKind::kForward; }
  int source(const Action& a) const { return forward(a) ? a.stage - 1 : a.stage + 1; }
  int dest(const Action& a) const { return forward(a) ? a.stage + 1 : a.stage - 1; }
  bool exists(int stage) const { return stage >= 0 && stage < s_.num_stages; }

  bool step(int k) {
    StageState& st = state_[k];
    if (at_barrier(k) || st.pc >= s_.stages[k].size()) return false;
    const Action& a = s_.stages[k][st.pc];
    switch (st.phase) {
      case Phase::kReceive: {
        if (exists(source(a))) {
          auto& box = channels_[Key{source(a), k, !forward(a)}];
          if (!box.erase(a.microbatch)) return false;
        }
        st.phase = Phase::kSend;
        return true;
      }
      case Phase::kSend: {
        if (exists(dest(a))) {
          auto& box = channels_[Key{k, dest(a), !forward(a)}];
          if (static_cast<int>(box.size()) >= std::max(capacity_, 1)) return false;
          box.insert(a.microbatch);
          if (capacity_ == 0) {
            st.phase = Phase::kAwaitTake;
            return true;
          }
        }
        break;
      }
      case Phase::kAwaitTake: {
        if (channels_[Key{k, dest(a), !forward(a)}].count(a.microbatch)) return false;
        break;
      }
    }
    ++st.pc;
    st.phase = Phase::kReceive;
    return true;
  }

  std::string waiting_for(int k) const {
    const Action& a = s_.stages[k][state_[k].pc];
    const char* what = forward(a) ? "activation" : "gradient";
    std::ostringstream os;
    switch (state_[k].phase) {
      case Phase::kReceive:
        os << "waiting for the " << what << " of micro-batch " << a.microbatch << " from stage " << source(a);
        break;
      case Phase::kSend:
        os << "sending the " << what << " of micro-batch " << a.microbatch << " to stage " << dest(a)
           << " (channel full)";
        break;
      case Phase::kAwaitTake:
        os << "waiting for stage " << dest(a) << " to take the " << what << " of micro-batch " << a.microbatch;
        break;
    }
    return os.str();
  }

  const Schedule& s_;
  int capacity_;
  std::vector<StageState> state_;
  std::map<Key, std::set<int>> channels_;
};

}  // namespace

// Declarations that contradict each other or the action lists.
void check_declarations(const Schedule& s) {
  if (s.vertical_sync && !s.weight_stashing) fail("vertical sync is declared without weight stashing");
  if (s.weight_stashing && !s.step_per_microbatch) {
    fail("weight stashing is declared but the optimizer steps once per batch: there are no versions to stash");
  }
  if (!s.barriers.empty()) {
    if (static_cast<int>(s.barriers.size()) != s.num_stages) fail("barriers are given for some stages only");
    for (int k = 0; k < s.num_stages; ++k) {
      if (s.barriers[k].size() != s.barriers[0].size()) {
        fail("stage " + std::to_string(k) + " has " + std::to_string(s.barriers[k].size()) + " barriers, stage 0 has " +
             std::to_string(s.barriers[0].size()) + ": every stage must meet every barrier");
      }
      for (size_t i = 0; i < s.barriers[k].size(); ++i) {
        if (s.barriers[k][i] > s.stages[k].size() || (i > 0 && s.barriers[k][i] < s.barriers[k][i - 1])) {
          fail("stage " + std::to_string(k) + "'s barrier " + std::to_string(i) + " is out of order");
        }
      }
    }
  }
  if (!s.vertical_sync || !s.step_per_microbatch) return;
  // A forward can only use a version its stage has already produced.
  const auto versions = forward_versions(s);
  for (int k = 0; k < s.num_stages; ++k) {
    int steps = 0;
    for (int i = 0; i < static_cast<int>(s.stages[k].size()); ++i) {
      const Action& a = s.stages[k][i];
      if (a.kind == ActionKind::kBackward) ++steps;
      if (a.kind == ActionKind::kForward && versions[k][a.microbatch] > steps) {
        fail(where(a, i) + ": vertical sync needs weight version " + std::to_string(versions[k][a.microbatch]) +
             " but stage " + std::to_string(k) + " has made only " + std::to_string(steps) + " updates by then");
      }
    }
  }
}

void validate(const Schedule& schedule, const ValidateOptions& options) {
  check_shape(schedule);
  check_actions(schedule, options.require_backward);
  check_declarations(schedule);
  if (options.channel_capacity < 0) fail("channel capacity " + std::to_string(options.channel_capacity) + " < 0");
  BlockingReplay(schedule, options.channel_capacity).run();
}

}  // namespace conveyor::schedules
