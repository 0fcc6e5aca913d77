#pragma once
// The examples' training-option flags: --autocast none|bf16|fp16, and what a
// step sent across its stage boundaries.

#include "examples/common/flags.h"
#include "plugin/core/step_result.h"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>

namespace conveyor::examples {

// The dtype for PipelineOptions::autocast, or none; anything else is a
// UsageError naming the flag.
inline std::optional<c10::ScalarType> autocast_dtype(const std::string& flag, const std::string& value) {
  if (value == "none") return std::nullopt;
  if (value == "bf16") return c10::ScalarType::BFloat16;
  if (value == "fp16") return c10::ScalarType::Half;
  throw UsageError(flag + " expects none, bf16 or fp16, got '" + value + "'");
}

// Bytes that crossed the stage boundaries in a step, both ways.
inline int64_t boundary_bytes(const StepResult& step) {
  int64_t bytes = 0;
  for (const int64_t b : step.activation_bytes_sent) bytes += b;
  for (const int64_t b : step.gradient_bytes_sent) bytes += b;
  return bytes;
}

}  // namespace conveyor::examples
