#include "plugin/core/options.h"

#include "plugin/core/errors.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <stdexcept>

namespace conveyor {

OptimizerFactory optimizer_factory(const PipelineOptions& options) {
  const OptimizerSpec& spec = options.optimizer();
  if (!spec.name) {
    for (const auto& [name, given] : {std::pair{"lr", options.lr().has_value()},
                                      std::pair{"momentum", options.momentum().has_value()},
                                      std::pair{"weight_decay", options.weight_decay().has_value()}}) {
      check_argument(!given || spec.factory, "conveyor: option '", name, "' sets the pipeline's own optimizer: give ",
                     "'optimizer' too (or step a torch.optim optimizer over parameters() yourself)");
      check_argument(!given, "conveyor: option '", name, "' is for an optimizer given by name; the factory given ",
                     "as 'optimizer' makes its optimizer with its own");
    }
    return spec.factory;
  }
  const OptimizerName name = *spec.name;
  check_argument(options.lr().has_value(), "conveyor: option 'optimizer' needs 'lr'");
  const double lr = *options.lr(), momentum = options.momentum().value_or(0);
  const double weight_decay = options.weight_decay().value_or(name == OptimizerName::kAdamW ? 1e-2 : 0.0);
  check_argument(name == OptimizerName::kSgd || !options.momentum(), "conveyor: option 'momentum' is for ",
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
  throw std::invalid_argument("conveyor: unknown optimizer");
}

void set_optimizer_factory(PipelineOptions& options, OptimizerFactory factory) {
  options.optimizer(std::move(factory)).lr(std::nullopt).momentum(std::nullopt).weight_decay(std::nullopt);
}

void check_option_values(const PipelineOptions& options) {
  check_bounds(options);
}

}  // namespace conveyor
