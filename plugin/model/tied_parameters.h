#pragma once
// Tied parameters: one logical parameter held by layers of several stages
// (PipelineOptions::tied_parameters). Found before the stages are built:
// declared groups of names, and tensors registered in layers of several
// stages. A shared tensor is untied into one copy per stage (the runtime
// keeps the copies identical, see TiedParameter in plugin/runtime/runtime.h) by a
// layer that can give a parameter a tensor of its own (RebindsParameters,
// which ScriptLayer implements); any other layer is refused.

#include "plugin/model/stage_split.h"

#include <torch/nn/modules/container/any.h>

#include <string>
#include <utility>
#include <vector>

namespace conveyor {

class RebindsParameters {
 public:
  virtual ~RebindsParameters() = default;
  // Makes the layer's parameter `name` (as the layer's named_parameters()
  // calls it) `replacement` wherever the layer's code reads it.
  virtual void rebind_parameter(const std::string& name, const at::Tensor& replacement) = 0;
};

// A group's holders: (stage, parameter name in the Sequential), stages ascending.
using TiedNames = std::vector<std::pair<int, std::string>>;

// The model's tie groups. `layers` are the Sequential's (name, layer);
// `untie` (in-process) gives every stage after a shared tensor's first its own
// copy. Throws std::invalid_argument naming the parameter for a name that is
// no parameter, copies of different shapes or dtypes, a name in two groups,
// or a shared tensor whose layer cannot be given a copy.
std::vector<TiedNames> find_tied_parameters(const std::vector<std::pair<std::string, torch::nn::AnyModule>>& layers,
                                            const StageSplit& plan,
                                            const std::vector<std::vector<std::string>>& declared, bool untie);

}  // namespace conveyor
