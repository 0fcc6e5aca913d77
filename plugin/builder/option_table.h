#pragma once
// The table of every option a pipeline from Python can be given: the rows of
// PipelineOptions', BuildOptions' and DistributedOptions' lists, which the
// Python keywords, the TorchScript class's keys and the manual's reference
// come from.

#include "plugin/option_values.h"

#include <string>
#include <vector>

namespace conveyor {

// Every row of PipelineOptions', BuildOptions' and DistributedOptions' lists,
// with their defaults, grouped by section: what a pipeline from Python can be
// given.
std::vector<OptionDescription> every_option();

// The manual's reference of every option (docs/reference/options.md, generated
// by docs/generate.py): a markdown table per section, under a top-level
// heading of its own (the page includes it a level down).
std::string options_reference();

}  // namespace conveyor
