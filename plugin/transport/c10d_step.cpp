// The c10d transport around its messages (c10d.cpp): where the stages run, its end,
// receives announced ahead, the counts, barriers, the end of a step and its
// commit, and abort.
#include "plugin/transport/c10d_state.h"

namespace conveyor {

void C10dTransport::place(const std::vector<int>& placement) {
  State& s = *state_;
  const int workers = static_cast<int>(s.options.ranks.size());
  std::string local;
  int num_local = 0;
  for (size_t k = 0; k < placement.size(); ++k) {
    TORCH_CHECK(placement[k] >= 0 && placement[k] < workers, "conveyor: stage ", k, " is placed on worker ",
                placement[k], ", but the pipeline group has ", workers, " processes");
    if (placement[k] != s.options.worker) continue;
    local += c10::str(num_local++ ? ", " : "", k);
  }
  TORCH_CHECK(num_local > 0, "conveyor: the placement gives worker ", s.options.worker, " no stage");
  std::lock_guard<std::mutex> lock(s.mutex);
  s.placement = placement;
  // Every process places the same way, so all of them drop the accelerator group together.
  if (static_cast<int>(placement.size()) != workers) s.device_group.reset();
  s.prefix =
      c10::str("rank ", s.options.ranks.at(s.options.worker), " (stage", num_local == 1 ? " " : "s ", local, ")");
}

C10dTransport::~C10dTransport() {
  // Never block here: whatever was not delivered is abandoned (a step that
  // returned normally has delivered everything already).
  try {
    abort();
  } catch (...) {
  }
}


std::string C10dTransport::failure() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->failure;
}

void C10dTransport::expect(Channel channel, int from, int to, int mb) {
  State& s = *state_;
  if (!s.is_local(to) || from < 0 || from >= s.num_stages() || s.is_local(from)) return;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.failure.empty()) return;
    s.expected[channel].emplace_back(from, mb);
  }
  s.post_ahead(channel);
}

int C10dTransport::shared_memory_links() const { return state_->links ? state_->links->links() : 0; }

C10dTransport::Counts C10dTransport::counts() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->counts;
}

void C10dTransport::barrier(int worker, int index) {
  State& s = *state_;
  s.check_usable();
  s.group_barrier("enter", c10::str("lock-step barrier ", index, " of the pipeline (worker ", worker, ")"));
}

void C10dTransport::abort() {
  State& s = *state_;
  std::vector<c10::intrusive_ptr<Work>> pending;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.failure.empty()) s.failure = s.prefix + ": the step was stopped by a failure on this rank";
    pending = s.waiting;
    for (const auto& p : s.posted) pending.insert(pending.end(), p.works.begin(), p.works.end());
    for (const auto& [key, a] : s.ahead) pending.push_back(a.work);
    s.posted.clear();
    s.expected.clear();
  }
  if (s.links) s.links->abort();
  for (const auto& work : pending) {
    try {
      if (work) work->abort();
    } catch (...) {
      // Some works cannot be aborted; the group is abandoned anyway.
    }
  }
}

void C10dTransport::finish_step() {
  State& s = *state_;
  std::vector<State::Posted> posted;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    posted.swap(s.posted);
  }
  const auto deadline = Clock::now() + s.options.timeout;
  for (const auto& p : posted) {
    for (const auto& work : p.works) s.wait(work, deadline, p.to, p.what + " to be taken by " + s.stage_name(p.to));
  }
}

void C10dTransport::commit() {
  State& s = *state_;
  s.check_usable();
  std::string others;
  for (int k = 0; k < s.num_stages(); ++k) {
    if (!s.is_local(k)) others += (others.empty() ? "" : ", ") + s.stage_name(k);
  }
  s.group_barrier("wait for", "the other stages (" + others + ") to finish the step");
}

void C10dTransport::reduce_over_workers(at::Tensor& values, bool max) {
  State& s = *state_;
  s.check_usable();
  TORCH_CHECK(values.device().is_cpu() && values.is_contiguous(), "conveyor: reduce_over_workers takes a contiguous ",
              "CPU tensor");
  c10d::AllreduceOptions reduce_options;
  reduce_options.reduceOp = max ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
  reduce_options.timeout = s.options.timeout;
  std::vector<at::Tensor> list{values};
  const std::string what = "the other workers to reduce the update's verdict or gradient norm";
  c10::intrusive_ptr<Work> work;
  try {
    work = s.group->allreduce(list, reduce_options);
  } catch (const std::exception& e) {
    s.fail(s.prefix + ": could not wait for " + what + " [" + message_of(e) + "]");
  }
  s.wait(work, Clock::now() + s.options.timeout, -1, what);
}

void C10dTransport::reset() {
  state_->check_usable();
  finish_step();
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->sent_activations.clear();
  state_->expected.clear();
  state_->local_messages.clear();
}

}  // namespace conveyor
