#pragma once
// Reading a TorchScript model's forward graph to cut it into pipeline layers:
// either the plain chain of submodule calls it is, or segments between split
// points. Used by sequential_from_script (plugin/script/torchscript.h); every error
// is a std::invalid_argument that names what was found and where.

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/api/module.h>

#include <memory>
#include <string>
#include <vector>

namespace conveyor {

// The submodule of `model` at a dotted path; throws naming the first missing
// part and the submodules that do exist there.
torch::jit::Module submodule_of(const torch::jit::Module& model, const std::string& path);

// The paths of the submodules the forward calls, in order, when it is a plain
// chain: each called once, on the previous call's output (the first on the
// input), the last one's output returned, nothing else computed.
std::vector<std::string> chain_of_calls(const torch::jit::Module& model);

// One stage's part of the forward: `function` takes (model, *tensors live
// across the cut before it; the forward's arguments for the first) and
// returns the tensors live across the cut after it (one, or a tuple of
// several; the model's output for the last).
struct ScriptSegment {
  std::shared_ptr<torch::jit::GraphFunction> function;
  size_t num_inputs = 1;
  std::vector<std::string> state;       // parameters and buffers it reads, dotted
  // Those of `state` that an earlier segment reads too (a tied weight): the
  // function takes them as extra arguments after the tensors, in this order.
  std::vector<std::string> fed;
  std::vector<std::string> submodules;  // submodules it calls
  std::string description;              // "the forward from 'encoder.layer2' up to 'decoder'"
};

// split_points.size() + 1 segments; each split point names the submodule
// whose call begins the next one.
std::vector<ScriptSegment> cut_forward(const torch::jit::Module& model, const std::vector<std::string>& split_points);

}  // namespace conveyor
