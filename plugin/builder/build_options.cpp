#include "plugin/builder/build_options.h"

#include "plugin/errors.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <stdexcept>

namespace conveyor {

OptimizerFactory optimizer_from(const BuildOptions& options) {
  if (!options.optimizer()) {
    for (const auto& [name, given] : {std::pair{"lr", options.lr().has_value()},
                                      std::pair{"momentum", options.momentum().has_value()},
                                      std::pair{"weight_decay", options.weight_decay().has_value()}}) {
      check_argument(!given, "conveyor.Pipeline: option '", name, "' sets the pipeline's own optimizer: give ",
                     "'optimizer' too (or step a torch.optim optimizer over parameters() yourself)");
    }
    return nullptr;
  }
  const OptimizerName name = *options.optimizer();
  check_argument(options.lr().has_value(), "conveyor.Pipeline: option 'optimizer' needs 'lr'");
  const double lr = *options.lr(), momentum = options.momentum().value_or(0);
  const double weight_decay = options.weight_decay().value_or(name == OptimizerName::kAdamW ? 1e-2 : 0.0);
  check_argument(name == OptimizerName::kSgd || !options.momentum(), "conveyor.Pipeline: option 'momentum' is for ",
                 "optimizer 'sgd', not '", value_name(name), "'");
  switch (name) {
    case OptimizerName::kSgd:
      return [=](std::vector<at::Tensor> p) {
        return std::make_unique<torch::optim::SGD>(
            p, torch::optim::SGDOptions(lr).momentum(momentum).weight_decay(weight_decay));
      };
    case OptimizerName::kAdam:
      return [=](std::vector<at::Tensor> p) {
        return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(lr).weight_decay(weight_decay));
      };
    case OptimizerName::kAdamW:
      return [=](std::vector<at::Tensor> p) {
        return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(lr).weight_decay(weight_decay));
      };
  }
  throw std::invalid_argument("conveyor.Pipeline: unknown optimizer");
}

}  // namespace conveyor
