// The foundation reaching up to the public class: check_layout.cmake must refuse it.
#include "plugin/pipeline.h"
