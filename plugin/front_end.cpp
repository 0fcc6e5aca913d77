#include "plugin/front_end.h"

#include "plugin/errors.h"
#include "plugin/model_names.h"
#include "plugin/planner/partition.h"
#include "plugin/planner/planner.h"
#include "plugin/profile_model.h"

#include <algorithm>
#include <memory>
#include <numeric>
#include <stdexcept>

namespace conveyor {

std::vector<int64_t> split_point_boundaries(const std::vector<std::string>& split_points) {
  std::vector<int64_t> boundaries(split_points.size());
  std::iota(boundaries.begin(), boundaries.end(), 1);
  return boundaries;
}

void apply_split_points(PipelineOptions& options, const std::vector<std::string>& split_points) {
  if (split_points.empty()) return;
  const int stages = static_cast<int>(split_points.size()) + 1;
  if (!options.boundaries().empty()) {
    throw std::invalid_argument("conveyor: give either split points or boundaries, not both");
  }
  const int v = chunks_per_worker(options);
  // A schedule's text says itself how many stages each worker runs.
  const bool fits = options.workers() == 0 || !options.schedule_text().empty() || options.workers() * v == stages;
  check_argument(fits, "conveyor: ", split_points.size(), " split points make ", stages,
                 " stages, but the options ask for ", options.workers(),
                 v > 1 ? c10::str(" workers of ", v, " chunks each") : "");
  options.boundaries(split_point_boundaries(split_points));
}

std::string layer_parameter_name(const torch::nn::Sequential& layers, const std::string& model_name) {
  for (const auto& item : layers->named_children()) {
    const auto* layer = dynamic_cast<const ModelPath*>(item.value().get());
    if (!layer) continue;
    const std::string path = layer->model_path();
    const std::string prefix = path.empty() ? "" : path + ".";
    if (model_name.rfind(prefix, 0) != 0) continue;
    const std::string relative = model_name.substr(prefix.size());
    if (item.value()->named_parameters().find(relative)) return item.key() + "." + relative;
  }
  throw std::invalid_argument("conveyor: tied_parameters names '" + model_name + "', which is no parameter that " +
                              "the model's forward uses");
}

FrontEndStages front_end_stages(torch::nn::Sequential layers, PipelineOptions options,
                                const std::vector<std::vector<std::string>>& tied_parameters,
                                const ProfileBatch* profile_batch, std::string* plan_text) {
  auto tied = options.tied_parameters();
  for (const auto& group : tied_parameters) {
    std::vector<std::string> names;
    for (const auto& name : group) names.push_back(layer_parameter_name(layers, name));
    tied.push_back(std::move(names));
  }
  options.tied_parameters(std::move(tied));
  if (options.balance() == Balance::kTime && !options.profile()) {
    if (!profile_batch) {
      throw std::invalid_argument("conveyor: balance by time profiles the model on a sample batch: give one");
    }
    options.profile(std::make_shared<ModelProfile>(profile_first_microbatch(
        layers, profile_batch->inputs, profile_batch->targets, profile_batch->loss, options)));
    if (plan_text) {
      int64_t batch = 0;
      for (const auto& t : profile_batch->inputs) {
        if (t.defined() && t.dim() > options.batch_dim()) {
          batch = t.size(options.batch_dim());
          break;
        }
      }
      *plan_text = make_plan(layers, options, batch).str();
    }
  }
  return FrontEndStages{layers, std::move(options)};
}

}  // namespace conveyor
