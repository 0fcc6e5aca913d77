#pragma once
// Runs a range of a torch.export program's nodes: each operator called
// through the dispatcher, with autograd on when grad mode is (so the graph's
// backward is autograd's, as in eager PyTorch), each symbolic size computed
// from the values the nodes before it made.

#include "plugin/export/program.h"

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <vector>

namespace conveyor::exported {

struct RunContext {
  // The device that tensors the graph creates go on (the exported one is
  // replaced): the layer's.
  c10::Device device = c10::kCPU;
  // Evaluation mode sets dropout's and batch norm's training arguments false
  // and skips num_batches_tracked's update, as Module.eval() would.
  bool training = true;
};

// Runs nodes [first, last) of `program`; `values` holds one entry per slot,
// those the nodes read already set; each node's results are stored in their
// slots. A failing node throws c10::Error naming the node, its operator and
// the module it came from, with what the operator said.
void run_nodes(const Program& program, size_t first, size_t last, std::vector<c10::IValue>& values,
               const RunContext& context);

// A symbolic size (int, float or bool) that crossed a cut as a 0-dim tensor,
// back as the number; any other value as it is.
c10::IValue number_from(const c10::IValue& value);

}  // namespace conveyor::exported
