// An op that reaches up into the plugin: check_layout.cmake must refuse it.
#include "plugin/runtime/runtime.h"
