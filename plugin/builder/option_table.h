#pragma once
// The table of every option a pipeline from Python can be given: the rows of
// PipelineOptions', BuildOptions' and DistributedOptions' lists, which the
// Python keywords, the TorchScript class's keys and the manual's reference
// come from.

#include "plugin/option_list.h"
#include "plugin/option_values.h"
#include "plugin/options.h"

#include <string>
#include <vector>

namespace conveyor {

// Every row of PipelineOptions', BuildOptions' and DistributedOptions' lists,
// with the values of the three given, grouped by section (the schedule's
// documentation naming the schedule library's schedules).
std::vector<OptionDescription> every_option(const PipelineOptions& options, const BuildOptions& build,
                                            const DistributedOptions& distributed);
// The same with their defaults: what a pipeline from Python can be given.
std::vector<OptionDescription> every_option();

// The manual's reference of every option (docs/reference/options.md, generated
// by docs/generate.py): a markdown table per section, under a top-level
// heading of its own (the page includes it a level down).
std::string options_reference();

}  // namespace conveyor
