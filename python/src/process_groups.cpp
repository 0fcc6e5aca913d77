#include "python/src/process_groups.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>
#include <stdexcept>
#include <string>

namespace py = pybind11;

namespace conveyor {

namespace {

// The backend of a torch.distributed ProcessGroup for one kind of device;
// null where it has none.
c10::intrusive_ptr<c10d::Backend> backend_of(const py::object& group, c10::DeviceType type) {
  auto* pg = py::cast<c10d::ProcessGroup*>(group);
  // (getDeviceTypes, not hasBackendForDeviceType: torch 2.11 has only the former.)
  for (const c10::Device& device : pg->getDeviceTypes()) {
    if (device.type() == type) return pg->getBackend(type);
  }
  return {};
}

}  // namespace

std::shared_ptr<ProcessGroups> process_groups(const py::object& pipeline_group, const py::object& replica_group,
                                              double timeout_seconds) {
  const auto cpu = [](const py::object& group, const char* name) {
    auto backend = backend_of(group, c10::DeviceType::CPU);
    if (!backend) {
      throw std::invalid_argument(std::string("conveyor.Pipeline: ") + name + " has no CPU backend; Conveyor " +
                                  "sends its messages over Gloo: init_process_group(backend=\"gloo\"), or " +
                                  "\"cpu:gloo,cuda:nccl\" for CUDA tensors over NCCL");
    }
    return backend;
  };
  ProcessGroups::Options options;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
  const bool replicated = !replica_group.is_none();
  return std::make_shared<ProcessGroups>(
      cpu(pipeline_group, "process_group"), replicated ? cpu(replica_group, "replica_group") : nullptr, options,
      backend_of(pipeline_group, c10::DeviceType::CUDA),
      replicated ? backend_of(replica_group, c10::DeviceType::CUDA) : nullptr);
}

}  // namespace conveyor
