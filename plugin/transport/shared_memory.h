#pragma once
// Shared-memory links between the worker processes of one machine, for the
// c10d transport's messages (C10dTransportOptions::shared_memory).
//
// Across processes on one machine Gloo moves every message through a TCP
// socket on loopback: a system call to write it, and on the receiving side
// an I/O thread woken from epoll to read it, then the waiting thread woken in
// turn. With stages of sub-millisecond micro-batches those wake-ups cost more
// processor time than the work, and on a machine with as many cores as
// processes they take it from the compute. A link here is a ring of bytes in
// a POSIX shared-memory segment per direction: a sender copies the message
// in, a receiver copies it out, and a futex wakes a receiver only when it is
// waiting. A message to a stage that is computing costs two copies and no
// system call.
//
// Each ring has one writer and one reader. The reader drains every record it
// finds into this process's memory, keyed by tag, so receives match by tag in
// any order, as Gloo's do. A sender that finds the ring full waits (at most
// the timeout) for room, draining its own incoming rings meanwhile, so two
// processes sending to each other never wait on each other.
//
// Failures: every wait is bounded by a deadline, checks every
// kPollMilliseconds whether the peer process still runs (a process that
// exited, even unreaped, fails the wait at once, as a closed socket would),
// and can be aborted. The segments are unlinked as soon as both ends have
// mapped them: nothing remains in /dev/shm after the processes end, however
// they end.

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace c10d {
class Backend;
class Work;
}  // namespace c10d

namespace conveyor {

class SharedMemoryLinks {
 public:
  static constexpr int kPollMilliseconds = 50;

  // Collective over `group` (every rank calls it): each worker offers a link
  // to its two neighbours in worker order (w - 1 and w + 1 modulo the group
  // size: the boundaries of every built-in schedule, interleaved ones
  // included), and a link is made where both ends share this machine's
  // shared memory. `ring_bytes`: each direction's capacity (at least twice
  // the largest message; c10d sends larger payloads on their own).
  SharedMemoryLinks(const c10::intrusive_ptr<c10d::Backend>& group, int64_t ring_bytes,
                    std::chrono::milliseconds timeout);
  ~SharedMemoryLinks();
  SharedMemoryLinks(const SharedMemoryLinks&) = delete;
  SharedMemoryLinks& operator=(const SharedMemoryLinks&) = delete;

  // Whether messages to (from) worker `peer` go through shared memory.
  bool sends_to(int peer) const;
  bool receives_from(int peer) const;
  // How many of this worker's links were made (for tests and the log).
  int links() const;

  // Copies `bytes` bytes at `data` into the ring to `peer` under `tag`;
  // waits for room until `deadline`. Throws std::runtime_error naming the
  // cause (timeout, peer gone, aborted).
  void send(int peer, int64_t tag, const void* data, int64_t bytes, std::chrono::steady_clock::time_point deadline);
  // A receive of the message `tag` from `peer` into `buffer` (a byte tensor
  // at least as large): a c10d work whose wait() takes it, so the c10d
  // transport waits on and aborts it as on Gloo's.
  c10::intrusive_ptr<c10d::Work> receive(int peer, int64_t tag, at::Tensor buffer);
  // Wakes every wait of this process's links; they fail as aborted.
  void abort();

  struct State;

 private:
  std::shared_ptr<State> state_;  // shared with the receives handed out
};

}  // namespace conveyor
