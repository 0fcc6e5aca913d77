#include "plugin/distributed/link_cost.h"

#include "plugin/distributed/gloo_group.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <exception>
#include <stdexcept>
#include <thread>
#include <vector>

namespace conveyor {

namespace {

using Clock = std::chrono::steady_clock;

// One transfer as the transport sends it: a small header, then the payload.
void send(c10d::Backend& group, at::Tensor& header, at::Tensor& payload, int to, int tag) {
  std::vector<at::Tensor> h{header}, p{payload};
  group.send(h, to, tag)->wait();
  group.send(p, to, tag + 1)->wait();
}

void recv(c10d::Backend& group, at::Tensor& header, at::Tensor& payload, int from, int tag) {
  std::vector<at::Tensor> h{header}, p{payload};
  group.recv(h, from, tag)->wait();
  group.recv(p, from, tag + 1)->wait();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

LinkProfile measure_c10d_link(int64_t large_bytes, int repeats, std::chrono::milliseconds timeout) {
  if (large_bytes < 1024 || repeats < 1) {
    throw std::invalid_argument("conveyor: measure_c10d_link needs at least 1 KiB and 1 repeat");
  }
  auto store = c10::make_intrusive<c10d::HashStore>();
  store->setTimeout(timeout);
  // Round trips of each payload size, seen from rank 0.
  std::vector<double> small_trips, large_trips;
  std::exception_ptr failure;
  const auto rank = [&](int r) {
    try {
      auto group = make_gloo_group(c10::make_intrusive<c10d::PrefixStore>("link", store), r, 2, timeout, timeout);
      at::Tensor header = at::zeros({16}, at::kLong);
      for (const int64_t bytes : {int64_t{4}, large_bytes}) {
        at::Tensor payload = at::zeros({bytes / 4}, at::kFloat);
        for (int i = 0; i <= repeats; ++i) {  // the first round trip warms the connection
          const auto start = Clock::now();
          if (r == 0) {
            send(*group, header, payload, 1, 2 * i);
            recv(*group, header, payload, 1, 2 * i);
          } else {
            recv(*group, header, payload, 0, 2 * i);
            send(*group, header, payload, 0, 2 * i);
          }
          const double trip = std::chrono::duration<double>(Clock::now() - start).count();
          if (r == 0 && i > 0) (bytes == 4 ? small_trips : large_trips).push_back(trip);
        }
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
  link.kind = "c10d Gloo over TCP loopback (header + payload per transfer)";
  link.latency_seconds = median(small_trips) / 2;
  const double extra = median(large_trips) / 2 - link.latency_seconds;
  link.bytes_per_second = extra > 0 ? static_cast<double>(large_bytes) / extra : 0.0;
  return link;
}

}  // namespace conveyor
