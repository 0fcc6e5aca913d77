#include "plugin/script/torchscript.h"

#include "plugin/core/errors.h"
#include "plugin/script/script_graph.h"

#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/import.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <stdexcept>

namespace conveyor {

namespace {

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// "encoder.layer2" -> "encoder_layer2": Sequential names hold no dots.
std::string layer_name(const std::string& path) {
  std::string name = path;
  std::replace(name.begin(), name.end(), '.', '_');
  return name;
}

}  // namespace

torch::jit::Module load_script(const std::string& path) {
  const std::string what = "conveyor: cannot load TorchScript model '" + path + "': ";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw std::invalid_argument(what + "no such file");
  if (std::filesystem::is_directory(path, ec)) throw std::invalid_argument(what + "it is a directory");
  std::vector<std::string> records;
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    records = reader.getAllRecords();
  } catch (const std::exception& e) {
    throw std::invalid_argument(what + "it is not a readable zip archive, so it is truncated, corrupt or not a " +
                                "PyTorch file at all (" + first_line(message_of(e)) + ")");
  }
  const auto has = [&](const std::string& prefix) {
    return std::any_of(records.begin(), records.end(), [&](const std::string& r) { return r.rfind(prefix, 0) == 0; });
  };
  if (!has("code/")) {
    if (has("data.pkl")) {
      throw std::invalid_argument(what + "it was written by torch.save and holds no TorchScript code; save the " +
                                  "model with torch.jit.save(torch.jit.script(model), path) (or torch.jit.trace)");
    }
    throw std::invalid_argument(what + "the archive holds no TorchScript code (no code/ records)");
  }
  try {
    return torch::jit::load(path);
  } catch (const std::exception& e) {
    throw std::invalid_argument(what + "the TorchScript archive is damaged: " + first_line(message_of(e)));
  }
}

torch::nn::Sequential sequential_from_script(torch::jit::Module model, const std::vector<std::string>& split_points,
                                             ScriptLayerOptions layer_options) {
  torch::nn::Sequential layers;
  if (split_points.empty()) {
    for (const std::string& path : chain_of_calls(model)) {
      const std::string name = layer_name(path);
      TORCH_CHECK(layers->named_children().find(name) == nullptr, "conveyor: two submodules of the model map to the ",
                  "layer name '", name, "'; give split points instead");
      layers->push_back(name, torch::nn::AnyModule(ScriptLayer(submodule_of(model, path), path, layer_options)));
    }
    return layers;
  }
  const std::vector<ScriptSegment> segments = cut_forward(model, split_points);
  for (size_t k = 0; k < segments.size(); ++k) {
    const ScriptSegment& s = segments[k];
    layers->push_back(
        "stage" + std::to_string(k),
        torch::nn::AnyModule(
            ScriptLayer(model, s.function, s.state, s.submodules, s.description, layer_options, s.fed)));
  }
  return layers;
}

}  // namespace conveyor
