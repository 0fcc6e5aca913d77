#pragma once
// A public header pulling the runtime in: check_layout.cmake must refuse it.
#include "plugin/runtime/runtime.h"
