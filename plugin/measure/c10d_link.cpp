#include "plugin/measure/c10d_link.h"

#include "plugin/distributed/gloo_group.h"
#include "plugin/support/timing.h"
#include "plugin/transport/c10d_header.h"
#include "plugin/transport/shared_memory.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <time.h>

#include <algorithm>
#include <exception>
#include <stdexcept>
#include <thread>
#include <vector>

namespace conveyor {

namespace {


// One transfer as the transport sends it: the header with the payload in one
// message while the whole fits c10d_wire::kMessageBytes, the header then the
// payload otherwise. The receiver posts its buffers before the sender sends
// (the transport posts them ahead too), so a transfer costs no handshake.
struct Transfer {
  at::Tensor first, payload;  // payload: defined only when it travels apart
  explicit Transfer(int64_t bytes) {
    using namespace c10d_wire;
    const bool fits = kHeaderBytes + aligned_payload(bytes) <= kMessageBytes;
    first = at::zeros({fits ? kHeaderBytes + aligned_payload(bytes) : kHeaderBytes}, at::kByte);
    if (!fits) payload = at::zeros({bytes}, at::kByte);
  }
  SharedMemoryLinks* links = nullptr;  // the first part through shared memory when set
  std::vector<c10::intrusive_ptr<c10d::Work>> post_recv(c10d::Backend& group, int from, int tag) {
    std::vector<at::Tensor> f{first};
    std::vector<c10::intrusive_ptr<c10d::Work>> works{links ? links->receive(from, tag, first)
                                                            : group.recv(f, from, tag)};
    if (payload.defined()) {
      std::vector<at::Tensor> p{payload};
      works.push_back(group.recv(p, from, tag + 1));
    }
    return works;
  }
  void send(c10d::Backend& group, int to, int tag) {
    std::vector<at::Tensor> f{first};
    if (links) {
      links->send(to, tag, first.const_data_ptr(), first.numel(), Clock::now() + std::chrono::minutes(1));
    } else {
      group.send(f, to, tag)->wait();
    }
    if (payload.defined()) {
      std::vector<at::Tensor> p{payload};
      group.send(p, to, tag + 1)->wait();
    }
  }
};

void wait_all(const std::vector<c10::intrusive_ptr<c10d::Work>>& works, std::chrono::milliseconds timeout) {
  for (const auto& w : works) {
    if (!w->wait(timeout)) throw std::runtime_error("conveyor: measure_c10d_link: a transfer was aborted");
  }
}

// Processor time this process has used, every thread of it (the two ranks'
// and Gloo's), in seconds.
double process_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

}  // namespace

LinkProfile measure_c10d_link(int64_t large_bytes, int repeats, std::chrono::milliseconds timeout,
                              bool shared_memory) {
  if (large_bytes < 1024 || repeats < 1) {
    throw std::invalid_argument("conveyor: measure_c10d_link needs at least 1 KiB and 1 repeat");
  }
  auto store = c10::make_intrusive<c10d::HashStore>();
  store->setTimeout(timeout);
  // Round trips of each payload size, seen from rank 0, and the processor
  // time both ranks used for the small ones (from rank 0's first timed trip
  // to its last: rank 1 runs its side meanwhile).
  std::vector<double> small_trips, large_trips;
  double small_cpu_seconds = 0, large_cpu_seconds = 0;
  const int small_repeats = std::max(repeats, 64);  // more of the cheap ones: the processor time is short
  std::exception_ptr failure;
  const auto rank = [&](int r) {
    try {
      auto group = make_gloo_group(c10::make_intrusive<c10d::PrefixStore>("link", store), r, 2, timeout, timeout);
      std::unique_ptr<SharedMemoryLinks> links;
      if (shared_memory) links = std::make_unique<SharedMemoryLinks>(group, int64_t{8} << 20, timeout);
      for (const int64_t bytes : {int64_t{4}, large_bytes}) {
        Transfer transfer(bytes);
        if (links && links->sends_to(1 - r) && links->receives_from(1 - r)) transfer.links = links.get();
        const int base = bytes == 4 ? 0 : 1 << 20;  // each size its own tags
        const int peer = 1 - r;
        // Both ranks post the first receive, then meet, so that it is posted before its send.
        auto pending = transfer.post_recv(*group, peer, base);
        group->barrier()->wait();
        double cpu_start = 0;
        const int rounds = bytes == 4 ? small_repeats : repeats;
        for (int i = 0; i <= rounds; ++i) {  // the first round trip warms the connection
          if (i == 1) cpu_start = process_cpu_seconds();
          const auto start = Clock::now();
          const int tag = base + 2 * i, next = base + 2 * (i + 1);
          if (r == 0) transfer.send(*group, peer, tag);
          wait_all(pending, timeout);
          if (i < rounds) pending = transfer.post_recv(*group, peer, next);
          if (r == 1) transfer.send(*group, peer, tag);
          const double trip = std::chrono::duration<double>(Clock::now() - start).count();
          if (r == 0 && i > 0) (bytes == 4 ? small_trips : large_trips).push_back(trip);
        }
        if (r == 0) (bytes == 4 ? small_cpu_seconds : large_cpu_seconds) = process_cpu_seconds() - cpu_start;
      }
    } catch (...) {
      if (r == 0) failure = std::current_exception();
    }
  };
  std::thread peer(rank, 1);
  rank(0);
  peer.join();
  if (failure) std::rethrow_exception(failure);
  LinkProfile link;
  link.kind = shared_memory ? "c10d, messages up to 1 MiB through shared memory, larger payloads over Gloo"
                            : "c10d Gloo over TCP loopback (one message per transfer up to 1 MiB)";
  link.latency_seconds = median(small_trips) / 2;
  const double extra = median(large_trips) / 2 - link.latency_seconds;
  link.bytes_per_second = extra > 0 ? static_cast<double>(large_bytes) / extra : 0.0;
  // Two transfers a round trip.
  link.cpu_seconds_per_transfer = small_cpu_seconds / (2.0 * small_repeats);
  const double large_cpu = large_cpu_seconds / (2.0 * repeats) - link.cpu_seconds_per_transfer;
  link.cpu_seconds_per_byte = std::max(0.0, large_cpu) / static_cast<double>(large_bytes);
  return link;
}

}  // namespace conveyor
