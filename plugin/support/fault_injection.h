#pragma once
// Fault injection, for the robustness tests: the points inside a step where a
// test makes something go wrong on purpose (a stage that throws or stalls, a
// loss that turns NaN, a message whose header lies, a peer that dies half-way
// through a message or drops its connection, a file write cut short), to check
// that every such failure is reported, bounded by the timeout, and leaves the
// weights of the last good step.
//
// Off unless a test installs a FaultInjector with a FaultInjectionScope. Each point then costs one
// relaxed load of a null atomic pointer, next to a message send or a layer's
// forward: nothing measurable. So the points stay in every build, and the
// tests exercise the very code users run (a separate test-only build would
// test other object code, and double CI's build time).

#include "schedules/action.h"

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

namespace conveyor {

enum class Channel;  // plugin/transport/transport.h

class FaultInjector {
 public:
  virtual ~FaultInjector() = default;

  // Before stage `stage`'s thread runs `action` of a step: may throw (the
  // stage fails in that action) or sleep (the stage stalls).
  virtual void before_action(int /*stage*/, const schedules::Action& /*action*/) {}

  // A training micro-batch's loss on the last stage; returns the loss to use.
  virtual at::Tensor on_loss(int /*stage*/, int /*microbatch*/, const at::Tensor& loss) { return loss; }

  // Before a message leaves stage `from`. The c10d transport passes its
  // header (c10d_wire::kHeaderLength values, filled in) to tamper with; the
  // in-process transport passes null. May throw, sleep or end the process.
  virtual void before_send(Channel /*channel*/, int /*from*/, int /*to*/, int /*mb*/, int64_t* /*header*/) {}

  // c10d: a message's first part is posted (its header, and the payloads that
  // ride with it); payloads on tags of their own are not yet.
  // `header_delivered` waits (bounded) until the peer has taken the header.
  virtual void after_header(Channel /*channel*/, int /*from*/, int /*to*/, int /*mb*/,
                            const std::function<void()>& /*header_delivered*/) {}

  // write_atomically(path): the number of bytes after which writing the
  // temporary file fails, as a full disk would; negative: no limit.
  virtual int64_t write_limit(const std::string& /*path*/) { return -1; }
};

namespace detail {
extern std::atomic<FaultInjector*> fault_injector;
}  // namespace detail

// Installs `injector` for the whole process while the scope lives, and
// removes it when the scope ends, also by an exception. Make it while no step
// runs; one at a time: a second scope while one lives is refused
// (std::logic_error), since the two would undo each other.
//
//   FaultInjectionScope faults(my_injector);
//   pipe.train_step(...);  // sees my_injector's faults
class FaultInjectionScope {
 public:
  explicit FaultInjectionScope(FaultInjector& injector);
  ~FaultInjectionScope();
  FaultInjectionScope(const FaultInjectionScope&) = delete;
  FaultInjectionScope& operator=(const FaultInjectionScope&) = delete;
};

inline FaultInjector* fault_injector() { return detail::fault_injector.load(std::memory_order_relaxed); }

}  // namespace conveyor
