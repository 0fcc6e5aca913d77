#pragma once
// A torch::optim optimizer's state keyed by parameter name rather than by
// tensor identity, as a dict that pickles (see plugin/checkpoint/checkpoint.h):
//   {"type": "Adam", "stage": -1, "param_groups": [{"lr", "params": [names]}],
//    "state": {name: {"step": 3, "exp_avg": tensor, ...}}}
// Supported: SGD, Adam, AdamW, Adagrad, RMSprop. Of the options only the
// learning rate is stored (schedulers change it); the rest come from the
// optimizer the state is loaded into.

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <string>

namespace conveyor {

// The name of each of the optimizer's parameters; throws for a tensor it does not know.
using ParameterNamer = std::function<std::string(const at::Tensor&)>;

// Throws std::invalid_argument for an unsupported optimizer.
c10::impl::GenericDict optimizer_state_to_dict(torch::optim::Optimizer& opt, const ParameterNamer& name_of);

// Checks `opt` against `saved` (type, parameter groups and the parameters in
// them, throwing std::invalid_argument prefixed with `what` on a mismatch) and
// returns the function that then restores the state, so that a caller can
// check everything before changing anything.
std::function<void()> optimizer_state_restorer(torch::optim::Optimizer& opt, const c10::impl::GenericDict& saved,
                                               const ParameterNamer& name_of, const std::string& what);

}  // namespace conveyor
