#include "plugin/export/exported.h"

#include "plugin/core/errors.h"
#include "plugin/export/archive.h"
#include "plugin/export/segments.h"

#include <caffe2/serialize/inline_container.h>

#include <c10/util/StringUtil.h>

#include <stdexcept>

namespace conveyor {

namespace {

// The tensor the program reads as `s`: given, else the archive's.
at::Tensor state_tensor(const exported::State& s, const exported::Archive& archive,
                        const std::map<std::string, at::Tensor>& given, const std::string& where) {
  if (const auto it = given.find(s.name); it != given.end()) return it->second;
  // Non-persistent buffers are no part of the state dict: torch.export.save
  // keeps them with the constants.
  for (const auto* from : {s.constant ? &archive.constants : &archive.weights, &archive.constants}) {
    if (const auto it = from->find(s.name); it != from->end()) {
      return !s.parameter && it->second.requires_grad() ? it->second.detach() : it->second;
    }
  }
  throw std::invalid_argument(c10::str(where, ": the program reads ", s.constant ? "constant" : "tensor", " '",
                                       s.name, "', which the archive does not hold"));
}

// Renames every later name of a tensor read under several (a tied weight) to
// its first, in `order`, then in the program's.
void name_tied_tensors_once(exported::Program& program, ExportedModel& model,
                            const std::vector<std::pair<std::string, at::Tensor>>& order) {
  std::map<const c10::TensorImpl*, std::string> first;
  for (const auto& [name, t] : order) {
    if (model.tensors.count(name)) first.emplace(t.unsafeGetTensorImpl(), name);
  }
  for (const exported::State& s : program.state) {
    if (!s.constant) first.emplace(model.tensors.at(s.name).unsafeGetTensorImpl(), s.name);
  }
  for (exported::State& s : program.state) {
    if (s.constant) continue;
    const std::string& name = first.at(model.tensors.at(s.name).unsafeGetTensorImpl());
    if (name == s.name) continue;
    model.aliases.emplace_back(s.name, name);
    for (auto& mutation : program.buffer_mutations) {
      if (mutation.first == s.name) mutation.first = name;
    }
    model.tensors.erase(s.name);
    s.name = name;
  }
}

}  // namespace

ExportedModel load_exported(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& given) {
  exported::Archive archive = exported::read_archive(path);
  const std::string where = "conveyor: '" + path + "'";
  ExportedModel model;
  model.path = path;
  auto program = std::make_shared<exported::Program>(exported::read_program(archive.program_json, where));
  const std::map<std::string, at::Tensor> by_name(given.begin(), given.end());
  for (const exported::State& s : program->state) {
    at::Tensor t = state_tensor(s, archive, by_name, where);
    if (const auto it = archive.weights.find(s.name); it != archive.weights.end() && by_name.count(s.name)) {
      check_argument(it->second.sizes().equals(t.sizes()) && it->second.scalar_type() == t.scalar_type(), where,
                     ": the program's '", s.name, "' is ", it->second.scalar_type(), it->second.sizes(),
                     ", the tensor given for it ", t.scalar_type(), t.sizes());
    }
    model.tensors.emplace(s.name, std::move(t));
  }
  name_tied_tensors_once(*program, model, given);
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
