#include "plugin/builder/front_end.h"

#include "ops/swap.h"
#include "plugin/builder/plan.h"
#include "plugin/core/errors.h"
#include "plugin/model/model_names.h"
#include "plugin/planner/partition.h"
#ifdef CONVEYOR_WITH_TORCHSCRIPT
#include "plugin/script/torchscript.h"
#endif
#ifdef CONVEYOR_WITH_EXPORT
#include "plugin/export/exported.h"
#endif

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace conveyor {

namespace {

// Sets the boundaries that `split_points` make (their count checked by
// check_request's check_split_point_count).
void apply_split_points(PipelineOptions& options, const std::vector<std::string>& split_points,
                        std::vector<int64_t> boundaries) {
  if (!split_points.empty()) options.boundaries(std::move(boundaries));
}

// The boundaries split points make of torch::nn layers: each names a layer.
std::vector<int64_t> layer_boundaries(const torch::nn::Sequential& layers,
                                      const std::vector<std::string>& split_points) {
  const auto names = layers->named_children().keys();
  std::vector<int64_t> boundaries;
  int64_t previous = 0;
  for (const std::string& point : split_points) {
    const auto it = std::find(names.begin(), names.end(), point);
    check_argument(it != names.end(), "conveyor: split point '", point, "' names no layer of the model (",
                   c10::Join(", ", names), ")");
    const int64_t index = it - names.begin();
    check_argument(index > previous, "conveyor: split point '", point, "' must come after the one before it, ",
                   "and not be the first layer");
    boundaries.push_back(previous = index);
  }
  return boundaries;
}

// A path's model: a .pt2 archive or a TorchScript file.
Model load_model(const std::string& path) {
#ifdef CONVEYOR_WITH_EXPORT
  if (holds_exported_program(path)) return std::make_shared<const ExportedModel>(load_exported(path));
#endif
#ifdef CONVEYOR_WITH_TORCHSCRIPT
  return load_script(path);
#else
  throw std::invalid_argument("conveyor: '" + path + "' holds no torch.export program, and this build reads no " +
                              "TorchScript (configured with CONVEYOR_TORCHSCRIPT=OFF)");
#endif
}

}  // namespace

void check_split_point_count(const PipelineOptions& options, const std::vector<std::string>& split_points) {
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
}

std::vector<int64_t> split_point_boundaries(const std::vector<std::string>& split_points) {
  std::vector<int64_t> boundaries(split_points.size());
  std::iota(boundaries.begin(), boundaries.end(), 1);
  return boundaries;
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

std::optional<ModelKind> model_kind(const Model& model) {
  if (std::holds_alternative<std::string>(model)) return std::nullopt;
  return std::holds_alternative<torch::nn::Sequential>(model)  ? ModelKind::layers
         : std::holds_alternative<torch::jit::Module>(model) ? ModelKind::script
                                                             : ModelKind::exported;
}

void check_model_kind(ModelKind kind, const PipelineOptions& options) {
  count_request(RequestStage::kKindCheck);
  const char* model = kind == ModelKind::layers ? "torch::nn layers" : "a torch.export program";
  check_argument(kind != ModelKind::exported || !options.fused_ops(), "conveyor: fused_ops swaps TorchScript ",
                 "submodules and torch::nn layers; a torch.export program runs the operators it was exported with ",
                 "(an nn.Module built with front_end='script' has them swapped)");
  check_argument(kind == ModelKind::script || !options.optimize(), "conveyor: optimize lets the TorchScript ",
                 "executor optimize the stages; the model is ", model);
}

ModelLayers model_layers(const Model& model, PipelineOptions& options, std::optional<ModelKind> checked_kind) {
  if (const auto* path = std::get_if<std::string>(&model)) {
    return model_layers(load_model(*path), options, checked_kind);
  }
  if (const auto kind = model_kind(model); kind != checked_kind) check_model_kind(*kind, options);
  const std::vector<std::string> split_points = options.split_points();  // a copy: options' boundaries change
  ModelLayers out;
  if (const auto* given = std::get_if<torch::nn::Sequential>(&model)) {
    check_argument(!given->is_empty(), "conveyor: the model is an empty Sequential");
    out.layers = *given;
    if (options.fused_ops()) out.fused_ops_report = swap_fused_ops(out.layers.ptr()).to_string();
    apply_split_points(options, split_points, layer_boundaries(out.layers, split_points));
    return out;  // tied_parameters name the layers' parameters already
  }
  if (const auto* module = std::get_if<torch::jit::Module>(&model)) {
#ifdef CONVEYOR_WITH_TORCHSCRIPT
    torch::jit::Module script = *module;  // the caller's module: the pipeline trains its tensors
    if (options.fused_ops()) out.fused_ops_report = swap_fused_ops(script).to_string();
    ScriptLayerOptions layer_options;
    layer_options.optimize = options.optimize();
    out.layers = sequential_from_script(script, split_points, layer_options);
#else
    throw std::invalid_argument("conveyor: this build reads no TorchScript (configured with CONVEYOR_TORCHSCRIPT=OFF)");
#endif
  } else {
    const auto& exported = std::get<std::shared_ptr<const ExportedModel>>(model);
#ifdef CONVEYOR_WITH_EXPORT
    check_argument(exported != nullptr, "conveyor: the exported model is empty (load it with load_exported)");
    out.layers = sequential_from_export(*exported, split_points);
    out.aliases = exported->aliases;
    for (const exported::State& s : exported->program->state) {
      if (!s.parameter && !s.constant && !s.persistent) out.transient_buffers.push_back(s.name);
    }
#else
    (void)exported;
    throw std::invalid_argument("conveyor: this build reads no torch.export programs (configured without them)");
#endif
  }
  apply_split_points(options, split_points, split_point_boundaries(split_points));
  std::vector<std::vector<std::string>> tied;
  for (const auto& group : options.tied_parameters()) {
    std::vector<std::string> names;
    for (const auto& name : group) names.push_back(layer_parameter_name(out.layers, name));
    tied.push_back(std::move(names));
  }
  options.tied_parameters(std::move(tied));
  return out;
}

}  // namespace conveyor
