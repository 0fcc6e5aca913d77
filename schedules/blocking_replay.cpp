#include "schedules/blocking_replay.h"

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

class BlockingReplay {
 public:
  BlockingReplay(const Schedule& s, int capacity) : s_(s), capacity_(capacity), state_(s.num_workers()) {}

  void run() {
    bool progressed = true;
    while (progressed) {
      progressed = false;
      for (int w = 0; w < s_.num_workers(); ++w) {
        while (step(w)) progressed = true;
      }
      progressed = pass_barrier() || progressed;
    }
    std::ostringstream stuck;
    for (int w = 0; w < s_.num_workers(); ++w) {
      const bool barrier = at_barrier(w);
      if (!barrier && state_[w].pc >= s_.workers[w].size()) continue;
      stuck << (stuck.tellp() > 0 ? "; " : "") << name(w);
      if (barrier) {
        stuck << " waits at barrier " << state_[w].barriers_passed << " for the other stages";
      } else {
        stuck << " blocks at " << s_.workers[w][state_[w].pc].str() << " " << waiting_for(w);
      }
    }
    if (stuck.tellp() > 0) {
      throw ScheduleError("invalid schedule: it deadlocks under blocking transfers with channel capacity " +
                          std::to_string(capacity_) + ": " + stuck.str());
    }
  }

 private:
  enum class Phase { kReceive, kSend, kAwaitTake };
  struct WorkerState {
    size_t pc = 0;
    Phase phase = Phase::kReceive;
    size_t barriers_passed = 0;
  };

  // "stage 1", or "worker 0" where a worker runs several stages.
  std::string name(int w) const { return (s_.has_virtual_stages() ? "worker " : "stage ") + std::to_string(w); }

  // True when worker w's next move is to wait at its next barrier.
  bool at_barrier(int w) const {
    const WorkerState& st = state_[w];
    return !s_.barriers.empty() && st.barriers_passed < s_.barriers[w].size() &&
           s_.barriers[w][st.barriers_passed] == st.pc && st.phase == Phase::kReceive;
  }

  // Lets every worker through its next barrier once all stand at it.
  bool pass_barrier() {
    if (s_.barriers.empty()) return false;
    for (int w = 0; w < s_.num_workers(); ++w) {
      if (!at_barrier(w)) return false;
    }
    for (auto& st : state_) ++st.barriers_passed;
    return true;
  }
  // A channel: (from stage, to stage, is_gradient) -> undelivered micro-batches.
  using Key = std::tuple<int, int, bool>;

  static bool forward(const Action& a) { return a.kind == ActionKind::kForward; }
  static bool moves(const Action& a) { return a.kind != ActionKind::kWeight; }
  int source(const Action& a) const { return forward(a) ? a.stage - 1 : a.stage + 1; }
  int dest(const Action& a) const { return forward(a) ? a.stage + 1 : a.stage - 1; }
  bool exists(int stage) const { return stage >= 0 && stage < s_.num_stages; }

  bool step(int w) {
    WorkerState& st = state_[w];
    if (at_barrier(w) || st.pc >= s_.workers[w].size()) return false;
    const Action& a = s_.workers[w][st.pc];
    switch (st.phase) {
      case Phase::kReceive: {
        if (moves(a) && exists(source(a))) {
          auto& box = channels_[Key{source(a), a.stage, !forward(a)}];
          if (!box.erase(a.microbatch)) return false;
        }
        st.phase = Phase::kSend;
        return true;
      }
      case Phase::kSend: {
        if (moves(a) && exists(dest(a))) {
          auto& box = channels_[Key{a.stage, dest(a), !forward(a)}];
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
        if (channels_[Key{a.stage, dest(a), !forward(a)}].count(a.microbatch)) return false;
        break;
      }
    }
    ++st.pc;
    st.phase = Phase::kReceive;
    return true;
  }

  std::string waiting_for(int w) const {
    const Action& a = s_.workers[w][state_[w].pc];
    const char* what = forward(a) ? "activation" : "gradient";
    std::ostringstream os;
    switch (state_[w].phase) {
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
  std::vector<WorkerState> state_;
  std::map<Key, std::set<int>> channels_;
};

}  // namespace

void replay_blocking(const Schedule& schedule, int capacity) { BlockingReplay(schedule, capacity).run(); }

}  // namespace conveyor::schedules
