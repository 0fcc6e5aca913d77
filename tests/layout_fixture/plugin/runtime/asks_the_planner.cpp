// The runtime asking the planner: check_layout.cmake must refuse it.
#include "plugin/planner/planner.h"
