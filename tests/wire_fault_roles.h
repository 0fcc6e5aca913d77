#pragma once
// The ranks of the wire-fault tests (tests/transport/test_wire_faults.cpp): a 2-stage
// pipeline over c10d takes two good steps, then a third during which one
// rank misbehaves on the wire at a send drawn from a seed
// (CONVEYOR_TEST_FAULT=kind, CONVEYOR_TEST_SEED). Each rank that lives writes
// the error its step ended with and whether its weights and optimizer state
// are still those after the second step.

#include "distributed_roles.h"
#include "plugin/support/fault_injection.h"
#include "plugin/transport/c10d_header.h"

#include <optional>

#include <dirent.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>

namespace conveyor::testing {

constexpr int kWireTimeoutMs = 1000;

// The send (0-based, counted within the faulty step) and the rank at which a
// seed's fault strikes. Each stage sends kMicrobatches messages a step.
inline int faulty_rank(uint32_t seed) { return static_cast<int>(seed % 2); }
inline int faulty_send(uint32_t seed) { return static_cast<int>((seed / 2) % kMicrobatches); }

// Drops every connection of this process (the process lives on; its
// listening sockets stay, as a peer's own would). Writing to them then fails
// with EPIPE instead of raising SIGPIPE.
inline void shut_down_connections() {
  ::signal(SIGPIPE, SIG_IGN);
  DIR* fds = ::opendir("/proc/self/fd");
  if (!fds) return;
  while (dirent* entry = ::readdir(fds)) {
    const int fd = std::atoi(entry->d_name);
    struct stat st;
    int listening = 0;
    socklen_t length = sizeof(listening);
    if (fd <= 2 || ::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length) == 0 && listening == 0) {
      ::shutdown(fd, SHUT_RDWR);
    }
  }
  ::closedir(fds);
}

class WireFault : public FaultInjector {
 public:
  WireFault(std::string kind, int at_send) : kind_(std::move(kind)), at_send_(at_send) {}
  void arm() { armed_ = true; }

  void before_send(Channel, int, int, int, int64_t* h) override {
    using namespace c10d_wire;
    hit_ = armed_ && h && sends_++ == at_send_;
    if (!hit_) return;
    int64_t* record = h + kPreambleLength;  // the first tensor's
    if (kind_ == "magic") {
      h[kMagicField] ^= 1;
    } else if (kind_ == "channel") {
      h[kChannel] = 1 - h[kChannel];
    } else if (kind_ == "microbatch") {
      h[kMicrobatch] += 1;
    } else if (kind_ == "dtype") {
      record[kDtype] = static_cast<int64_t>(c10::ScalarType::Float);
    } else if (kind_ == "shape") {
      record[kSizes + 1] += 1;
    } else if (kind_ == "stall") {
      std::this_thread::sleep_for(std::chrono::milliseconds(3 * kWireTimeoutMs));
    } else if (kind_ == "close") {
      shut_down_connections();
    }
  }

  void after_header(Channel, int, int, int, const std::function<void()>& header_delivered) override {
    if (!hit_ || kind_ != "die") return;
    header_delivered();
    ::_exit(9);  // mid-step: this message is out (its header, at least), the rest never will be
  }

 private:
  std::string kind_;
  int at_send_;
  bool armed_ = false, hit_ = false;
  int sends_ = 0;  // one stage thread sends
};

inline std::vector<at::Tensor> state_of(DistributedRunner& pipe) {
  std::vector<at::Tensor> s;
  for (const auto& p : pipe.parameters()) s.push_back(p.detach().clone());
  for (int k = 0; k < pipe.runner().num_stages(); ++k) {
    if (!pipe.runner().is_local(k)) continue;
    torch::optim::Optimizer& opt = *pipe.runner().stage(k).optimizer();
    for (const auto& p : opt.param_groups().at(0).params()) {
      const auto it = opt.state().find(p.unsafeGetTensorImpl());
      if (it != opt.state().end()) {
        s.push_back(static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer().clone());
      }
    }
    s.push_back(at::full({1}, static_cast<double>(pipe.runner().stage(k).updates()), at::kDouble));
  }
  return s;
}

inline void wire_fault(Worker& w) {
  const std::string kind = std::getenv("CONVEYOR_TEST_FAULT");
  const uint32_t seed = static_cast<uint32_t>(std::stoul(std::getenv("CONVEYOR_TEST_SEED")));
  const std::string schedule = seed % 4 < 2 ? "1f1b" : "pipedream";
  const std::chrono::milliseconds timeout(kWireTimeoutMs);
  auto groups = w.groups("wire", 2, timeout);
  torch::manual_seed(0);
  DistributedRunner pipe(
      make_mlp(), PipelineOptions(PipelineOptions().microbatches(kMicrobatches).schedule(schedule).timeout(timeout).optimizer(sgd_momentum())).distributed(link_options()),
      groups);
  for (int step = 0; step < 2; ++step) {
    const Data d = global_batch(step);
    pipe.train_step(d.x, d.y, mse);
  }
  const std::vector<at::Tensor> before = state_of(pipe);
  WireFault fault(kind, faulty_send(seed));
  std::optional<FaultInjectionScope> scope;
  if (w.env.rank == faulty_rank(seed)) {
    fault.arm();
    scope.emplace(fault);
  }
  std::string error = "no error";
  try {
    const Data d = global_batch(2);
    pipe.train_step(d.x, d.y, mse);
  } catch (const std::exception& e) {
    error = message_of(e);
  }
  scope.reset();
  w.note("error", error);
  const std::vector<at::Tensor> after = state_of(pipe);
  bool kept = after.size() == before.size();
  for (size_t i = 0; kept && i < after.size(); ++i) kept = torch::equal(after[i], before[i]);
  w.note("kept", kept ? "kept" : "changed");
}

}  // namespace conveyor::testing
