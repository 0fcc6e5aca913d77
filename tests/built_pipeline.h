#pragma once
// A conveyor::Pipeline (plugin/pipeline.h) of a model cut at split points,
// as the front-end tests train it: its StageRunner, kept alive with the
// Pipeline that owns it.

#include "plugin/pipeline.h"
#include "plugin/runner/stage_runner.h"
#ifdef CONVEYOR_WITH_EXPORT
#include "plugin/export/exported.h"
#endif

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace conveyor::testing {

inline std::shared_ptr<StageRunner> built_pipeline(const Model& model, PipelineOptions options,
                                                std::vector<std::string> split_points = {}) {
  if (!split_points.empty()) options.split_points(std::move(split_points));
  auto built = std::make_shared<Pipeline>(model, std::move(options));
  return std::shared_ptr<StageRunner>(built, &built->runner());
}

#ifdef CONVEYOR_WITH_EXPORT
inline std::shared_ptr<StageRunner> built_pipeline(const ExportedModel& model, PipelineOptions options,
                                                std::vector<std::string> split_points = {}) {
  return built_pipeline(Model(std::make_shared<const ExportedModel>(model)), std::move(options),
                        std::move(split_points));
}
#endif

}  // namespace conveyor::testing
