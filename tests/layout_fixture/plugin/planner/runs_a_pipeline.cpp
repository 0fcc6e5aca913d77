// The planner running a pipeline: check_layout.cmake must refuse it.
#include "plugin/runner/stage_runner.h"
