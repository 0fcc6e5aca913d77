// LibTorch's pip wheels ship ProcessGroupGloo.hpp but not the Gloo headers it
// includes. The class refers to Gloo's types only through pointers, and this
// file calls nothing of Gloo's, so unless CONVEYOR_GLOO_INCLUDE_DIR names real
// Gloo headers this file alone is compiled against plugin/distributed/gloo_declarations/,
// which declares just those names. It is compiled with inline functions
// hidden, so nothing it instantiates from the header can stand in for
// libtorch_cpu's own definitions.

#include "plugin/distributed/gloo_group.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cstdlib>
#include <string>

namespace conveyor {

namespace {

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value && *value ? value : nullptr;
}

bool is_loopback(const std::string& host) { return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0; }

std::shared_ptr<::gloo::transport::Device> gloo_device() {
  if (const char* ifname = env("GLOO_SOCKET_IFNAME")) {
    const std::string list(ifname);
    return c10d::ProcessGroupGloo::createDeviceForInterface(list.substr(0, list.find(',')));
  }
  const char* master = env("MASTER_ADDR");
  if (!master || is_loopback(master)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

c10::intrusive_ptr<c10d::Backend> make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                  std::chrono::milliseconds connect_timeout,
                                                  std::chrono::milliseconds timeout) {
  // One device per process would do, but a device is cheap next to a group.
  auto options = c10d::ProcessGroupGloo::Options::create(connect_timeout);
  options->devices.push_back(gloo_device());
  c10::intrusive_ptr<c10d::Backend> group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
  group->setTimeout(timeout);
  return group;
}

}  // namespace conveyor
