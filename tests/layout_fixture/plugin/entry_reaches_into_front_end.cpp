// The public entry point reaching into a front end: check_layout.cmake must refuse it.
#include "plugin/script/torchscript.h"
