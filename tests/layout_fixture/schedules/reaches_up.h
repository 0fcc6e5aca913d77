#pragma once
// A schedule header that reaches up a layer: check_layout.cmake must refuse it.
#include "plugin/runner/stage_runner.h"
