#pragma once
// The table of every option a pipeline can be given: the rows of
// plugin/core/option_list.h, which the Python keywords, the TorchScript
// class's keys and the manual's reference come from.

#include "plugin/core/option_list.h"
#include "plugin/core/option_values.h"
#include "plugin/core/options.h"

#include <string>
#include <vector>

namespace conveyor {

// Every row, with the values of `options`, section by section (the
// schedule's documentation naming the schedule library's schedules).
std::vector<OptionDescription> every_option(const PipelineOptions& options);
// The same with their defaults: what a pipeline from Python can be given.
std::vector<OptionDescription> every_option();

// The manual's reference of every option (docs/reference/options.md, generated
// by docs/generate.py): a markdown table per section, under a top-level
// heading of its own (the page includes it a level down).
std::string options_reference();

}  // namespace conveyor
