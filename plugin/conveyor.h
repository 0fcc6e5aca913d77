#pragma once
// Conveyor: pipeline model parallelism for LibTorch. Include this one header.

#include "ops/adapters.h"
#include "ops/tensors_layers.h"
#include "plugin/atomic_file.h"
#include "plugin/errors.h"
#include "plugin/model_names.h"
#include "plugin/options.h"
#include "plugin/partition.h"
#include "plugin/pipeline.h"
#include "plugin/step_result.h"
#include "schedules/generators.h"
#include "schedules/schedule.h"
#include "schedules/simulate.h"
#include "schedules/validate.h"
