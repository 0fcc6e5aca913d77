#include "plugin/export/archive.h"

#include "plugin/core/errors.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/utils/generated_serialization_types.h>

#include <ATen/ops/empty.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace conveyor::exported {

namespace ser = torch::_export;

namespace {

std::string record(caffe2::serialize::PyTorchStreamReader& reader, const std::string& name) {
  auto [data, size] = reader.getRecord(name);
  return std::string(static_cast<const char*>(data.get()), size);
}

at::ScalarType dtype_of(ser::ScalarType t, const std::string& what) {
  switch (t) {
    case ser::ScalarType::BYTE: return at::kByte;
    case ser::ScalarType::CHAR: return at::kChar;
    case ser::ScalarType::SHORT: return at::kShort;
    case ser::ScalarType::INT: return at::kInt;
    case ser::ScalarType::LONG: return at::kLong;
    case ser::ScalarType::HALF: return at::kHalf;
    case ser::ScalarType::FLOAT: return at::kFloat;
    case ser::ScalarType::DOUBLE: return at::kDouble;
    case ser::ScalarType::BOOL: return at::kBool;
    case ser::ScalarType::BFLOAT16: return at::kBFloat16;
    case ser::ScalarType::COMPLEXFLOAT: return at::kComplexFloat;
    case ser::ScalarType::COMPLEXDOUBLE: return at::kComplexDouble;
    default: throw std::invalid_argument(what + " is of a dtype this build does not read");
  }
}

int64_t int_of(const ser::SymInt& s, const std::string& what) {
  if (s.tag() != ser::SymInt::Tag::AS_INT) throw std::invalid_argument(what + " has a symbolic size");
  return s.get_as_int();
}

// The tensors of one config (weights or constants) under `folder`.
std::map<std::string, at::Tensor> read_payloads(caffe2::serialize::PyTorchStreamReader& reader,
                                                const std::string& folder, const std::string& config,
                                                const std::string& where) {
  std::map<std::string, at::Tensor> tensors;
  // Tied weights: torch.export.save writes one record for every name of a
  // tensor, and those names get one tensor here.
  std::map<std::string, at::Tensor> by_view;
  if (!reader.hasRecord(folder + config)) return tensors;
  ser::PayloadConfig payloads;
  try {
    payloads = nlohmann::json::parse(record(reader, folder + config)).get<ser::PayloadConfig>();
  } catch (const std::exception& e) {
    throw std::invalid_argument(where + ": " + folder + config + " is damaged (" + e.what() + ")");
  }
  for (const auto& [name, meta] : payloads.get_config()) {
    const std::string what = where + ": tensor '" + name + "'";
    if (meta.get_use_pickle()) {
      throw std::invalid_argument(what + " is pickled (a tensor subclass), which this build does not read");
    }
    if (!meta.get_tensor_meta()) throw std::invalid_argument(what + " has no tensor description");
    const ser::TensorMeta& m = *meta.get_tensor_meta();
    if (m.get_layout() != ser::Layout::Strided) throw std::invalid_argument(what + " is not a strided tensor");
    std::vector<int64_t> sizes, strides;
    for (const auto& s : m.get_sizes()) sizes.push_back(int_of(s, what));
    for (const auto& s : m.get_strides()) strides.push_back(int_of(s, what));
    const int64_t offset = int_of(m.get_storage_offset(), what);
    const at::ScalarType dtype = dtype_of(m.get_dtype(), what);
    const std::string file = folder + meta.get_path_name();
    const std::string view = c10::str(file, ' ', dtype, ' ', c10::IntArrayRef(sizes), ' ', c10::IntArrayRef(strides),
                                      ' ', offset);
    if (const auto seen = by_view.find(view); seen != by_view.end()) {
      tensors.emplace(name, seen->second);
      continue;
    }
    if (!reader.hasRecord(file)) throw std::invalid_argument(what + ": the archive has no record " + file);
    auto [data, bytes] = reader.getRecord(file);
    const int64_t item = static_cast<int64_t>(c10::elementSize(dtype));
    int64_t needed = offset + 1;  // elements the view reaches
    bool empty = false;
    for (size_t d = 0; d < sizes.size(); ++d) {
      empty = empty || sizes[d] == 0;
      needed += (sizes[d] - 1) * strides[d];
    }
    if (empty) needed = 0;
    if (static_cast<int64_t>(bytes) < needed * item) {
      throw std::invalid_argument(what + " needs " + std::to_string(needed * item) + " bytes and its record " +
                                  file + " holds " + std::to_string(bytes));
    }
    at::Tensor storage = at::empty({static_cast<int64_t>(bytes) / item}, at::TensorOptions().dtype(dtype));
    if (bytes > 0) std::memcpy(storage.data_ptr(), data.get(), storage.numel() * item);
    at::Tensor t = storage.as_strided(sizes, strides, offset).clone(at::MemoryFormat::Contiguous);
    if (meta.get_is_param() || m.get_requires_grad()) t.set_requires_grad(true);
    by_view.emplace(view, t);
    tensors.emplace(name, std::move(t));
  }
  return tensors;
}

}  // namespace

Archive read_archive(const std::string& path) {
  const std::string where = "conveyor: '" + path + "'";
  std::error_code ec;
  check_argument(std::filesystem::is_regular_file(path, ec), where, ": no such file");
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  try {
    reader = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
  } catch (const std::exception& e) {
    throw std::invalid_argument(where + " is no zip archive (truncated or corrupt?): " +
                                message_of(e).substr(0, message_of(e).find('\n')));
  }
  Archive archive;
  archive.path = path;
  std::vector<std::string> models;
  bool script = false;
  for (const std::string& r : reader->getAllRecords()) {
    if (r.rfind("models/", 0) == 0 && r.size() > 12 && r.substr(r.size() - 5) == ".json") {
      models.push_back(r.substr(7, r.size() - 12));
    }
    script = script || r.rfind("code/", 0) == 0 || r == "data.pkl";
  }
  if (models.empty()) {
    throw std::invalid_argument(where + " holds no ExportedProgram (no models/*.json record)" +
                                (script ? std::string(": it is a TorchScript or torch.save archive; save the program "
                                                      "with torch.export.save(torch.export.export(model, args), path)")
                                        : std::string()));
  }
  const std::string model =
      std::find(models.begin(), models.end(), "model") != models.end() ? "model" : models.front();
  if (reader->hasRecord("byteorder")) {
    const std::string order = record(*reader, "byteorder");
    check_argument(order.rfind("little", 0) == 0, where, " was written on a ", order,
                   "-endian machine; this build reads little-endian archives");
  }
  try {
    archive.program_json = record(*reader, "models/" + model + ".json");
    archive.weights = read_payloads(*reader, "data/weights/", model + "_weights_config.json", where);
    archive.constants = read_payloads(*reader, "data/constants/", model + "_constants_config.json", where);
  } catch (const std::invalid_argument&) {
    throw;
  } catch (const std::exception& e) {
    throw std::invalid_argument(where + " is damaged: " + message_of(e).substr(0, message_of(e).find('\n')));
  }
  return archive;
}

}  // namespace conveyor::exported
