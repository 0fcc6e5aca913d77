#pragma once
// BuildOptions: how a model given from Python (or TorchScript) becomes a
// pipeline: where to cut it, whether to search the plan, what to swap in,
// and the pipeline's own optimizer by name. Their rows are in
// plugin/option_list.h with every other option's; this file turns the
// optimizer's name into the factory the runtime takes.

#include "plugin/option_list.h"

namespace conveyor {

// The factory BuildOptions' optimizer, lr, momentum and weight_decay
// describe (null without an optimizer); std::invalid_argument for a
// combination that names no optimizer.
OptimizerFactory optimizer_from(const BuildOptions& options);

}  // namespace conveyor
