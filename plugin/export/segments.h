#pragma once
// Cutting a torch.export program into the pipeline's layers: runs of its
// nodes, with the values live across each cut passed on as tensors.
//
// Without split points each layer is the nodes of one module the model calls
// (a top-level submodule, or an item of a top-level Sequential, ModuleList or
// ModuleDict: "embed", "layers.0", "head"); the nodes of the model's own
// forward between them (a residual add, a mean) join the layer before, so the
// partition policy (or the planner's time balance) chooses among these. With
// split points each names the module whose first node begins the next
// segment, and each segment is one stage.

#include "plugin/export/program.h"

#include <string>
#include <vector>

namespace conveyor::exported {

struct Segment {
  size_t first = 0, last = 0;  // nodes [first, last)
  // Slots the layer takes (the program's tensor inputs for the first) and
  // returns (the program's outputs for the last), in slot order between.
  std::vector<int> inputs, outputs;
  std::vector<std::string> state;  // parameters, buffers and constants its nodes read, by name
  std::string name;                // the layer's name in the Sequential
  std::string description;         // for messages: "layers.1 .. head of 'lm.pt2'"
};

// The segments for `split_points` (see above). Throws std::invalid_argument
// for a split point that names no module the program calls after the one
// before it (listing those it calls), or one that would leave a segment empty.
std::vector<Segment> cut_program(const Program& program, const std::vector<std::string>& split_points,
                                 const std::string& where);

}  // namespace conveyor::exported
