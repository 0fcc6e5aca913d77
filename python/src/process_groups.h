#pragma once
// torch.distributed's process groups, handed over from Python, as the
// ProcessGroups a DistributedRunner runs over.

#include "plugin/distributed/process_groups.h"

#include <pybind11/pybind11.h>

#include <memory>

namespace conveyor {

// `pipeline_group`: the torch.distributed ProcessGroup of this replica's
// workers (its rank is the worker); `replica_group`: None, or the group of
// the processes running the same worker in every replica (its rank is the
// replica). Each needs a CPU backend (Gloo), over which Conveyor sends its
// messages; a CUDA backend (NCCL), where a group has one, carries CUDA
// tensors. `timeout_seconds` bounds every collective.
std::shared_ptr<ProcessGroups> process_groups(const pybind11::object& pipeline_group,
                                              const pybind11::object& replica_group, double timeout_seconds);

}  // namespace conveyor
