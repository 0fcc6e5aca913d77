// The core reaching into one of its rooms: check_layout.cmake must refuse it.
#include "plugin/script/torchscript.h"
