#include "plugin/export/exported.h"

#include "plugin/errors.h"
#include "plugin/export/archive.h"
#include "plugin/export/segments.h"

#include <caffe2/serialize/inline_container.h>

#include <stdexcept>

namespace conveyor {

ExportedModel load_exported(const std::string& path) {
  exported::Archive archive = exported::read_archive(path);
  const std::string where = "conveyor: '" + path + "'";
  ExportedModel model;
  model.path = path;
  auto program = std::make_shared<exported::Program>(exported::read_program(archive.program_json, where));
  for (const exported::State& s : program->state) {
    auto& from = s.constant ? archive.constants : archive.weights;
    const auto it = from.find(s.name);
    check_argument(it != from.end(), where, ": the program reads ", s.constant ? "constant" : "tensor", " '", s.name,
                   "', which the archive does not hold");
    at::Tensor t = it->second;
    if (!s.parameter && t.requires_grad()) t = t.detach();
    model.tensors.emplace(s.name, std::move(t));
  }
  model.program = std::move(program);
  return model;
}

bool holds_exported_program(const std::string& path) {
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    for (const std::string& r : reader.getAllRecords()) {
      if (r.rfind("models/", 0) == 0 && r.size() > 12 && r.substr(r.size() - 5) == ".json") return true;
    }
  } catch (const std::exception&) {
  }
  return false;
}

torch::nn::Sequential sequential_from_export(const ExportedModel& model, const std::vector<std::string>& split_points) {
  check_argument(model.program != nullptr, "conveyor: the exported model is empty (load it with load_exported)");
  const std::string where = "conveyor: '" + model.path + "'";
  torch::nn::Sequential layers;
  for (exported::Segment& seg : exported::cut_program(*model.program, split_points, where)) {
    seg.description += " of '" + model.path + "'";
    const std::string name = seg.name;
    layers->push_back(name, torch::nn::AnyModule(ExportLayer(model.program, std::move(seg), model.tensors, where)));
  }
  return layers;
}

}  // namespace conveyor
