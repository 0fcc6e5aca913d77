// The runner reaching into a front end that builds on it: check_layout.cmake must refuse it.
#include "plugin/script/torchscript.h"
