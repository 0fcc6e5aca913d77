#pragma once
// A ProcessGroupGloo made behind a plain function, so that one source file
// alone includes ProcessGroupGloo.hpp (see gloo_group.cpp for why).

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

namespace conveyor {

// Connects `size` ranks through `store` (a PrefixStore per group), waiting at
// most `connect_timeout`; every later operation is bounded by `timeout`.
// Gloo binds to GLOO_SOCKET_IFNAME when set (the first interface listed); to
// 127.0.0.1 when MASTER_ADDR is unset or a loopback address (every rank on
// this machine); otherwise to the address this machine's hostname resolves to.
c10::intrusive_ptr<c10d::Backend> make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                  std::chrono::milliseconds connect_timeout,
                                                  std::chrono::milliseconds timeout);

}  // namespace conveyor
