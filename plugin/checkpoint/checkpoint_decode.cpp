#include "plugin/checkpoint/checkpoint_decode.h"
#include "plugin/checkpoint/checkpoint_reshard.h"
#include "plugin/checkpoint/stage_optimizer.h"

#include "plugin/checkpoint/checked_ivalue.h"
#include "plugin/checkpoint/checkpoint_values.h"
#include "plugin/checkpoint/checkpoint_file.h"
#include "plugin/core/errors.h"

#include <ATen/Context.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <c10/util/StringUtil.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/storage_context.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>

namespace conveyor {

namespace {

using namespace checkpoint_values;

using checked::Dict;
using checked::List;


std::string shape(const at::Tensor& t) { return c10::str(t.sizes()); }

// A file's bytes for LibTorch's zip reader, which reads where the file's own
// offsets point: torch::pickle_load's reader copies past the end of a
// truncated file (tests/fuzz/corpus/checkpoint/*-truncated.ckpt); this one
// gives what is there, and the zip reader then refuses the file.
class BoundedReader final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BoundedReader(const std::vector<char>& bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    // miniz may ask for zero bytes with no buffer (a record that unpacks to
    // nothing): memcpy to a null pointer is undefined even for zero bytes.
    if (n == 0 || pos >= bytes_.size()) return 0;
    n = static_cast<size_t>(std::min<uint64_t>(n, bytes_.size() - pos));
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  const std::vector<char>& bytes_;
};

// Whether every length that the pickle's opcodes declare fits in what is left
// of it: LibTorch's unpickler allocates a string's or a frame's declared
// length (any 64-bit number), and a memo table as long as a memo id, before it
// finds the data short. Scanning stops, leaving the rest to
// the unpickler, at STOP, at an opcode it does not know or at a cut line.
bool pickle_lengths_fit(const char* data, size_t size) {
  const auto le = [&](size_t at, int n) { return little_endian(data + at, n); };
  size_t at = 0;
  while (at < size) {
    const unsigned char op = static_cast<unsigned char>(data[at++]);
    const size_t left = size - at;
    int fixed = -1, prefix = 0, lines = 0;
    if (std::strchr("(.0125NRabde}l]ostu)Q", op) != nullptr || (op >= 0x81 && op <= 0x89 && op != 0x82 &&
                                                                   op != 0x83 && op != 0x84) ||
        (op >= 0x8f && op <= 0x94) || op == 0x97 || op == 0x98) {
      fixed = 0;
    } else if (op == 'K' || op == 'q' || op == 'h' || op == 0x80 || op == 0x82) {
      fixed = 1;
    } else if (op == 'M' || op == 0x83) {
      fixed = 2;
    } else if (op == 'J' || op == 'r' || op == 'j' || op == 0x84) {
      fixed = 4;
    } else if (op == 'G') {
      fixed = 8;
    } else if (op == 0x95) {  // FRAME: the unpickler allocates the frame's declared length
      if (left < 8 || le(at, 8) > left - 8) return left < 8;
      at += 8;
      continue;
    } else if (op == 'U' || op == 'C' || op == 0x8c || op == 0x8a) {
      prefix = 1;
    } else if (op == 'T' || op == 'B' || op == 'X' || op == 0x8b) {
      prefix = 4;
    } else if (op == 0x8d || op == 0x8e || op == 0x96) {
      prefix = 8;
    } else if (std::strchr("ILSVFPgp", op) != nullptr) {
      lines = 1;
    } else if (op == 'c' || op == 'i') {
      lines = 2;
    } else {
      return true;  // not known here: the unpickler decides
    }
    if (op == '.') return true;
    // LONG_BINPUT: the unpickler grows its memo table to the id; a pickle
    // numbers its memo entries from 0, so no id exceeds its size.
    if (op == 'r' && left >= 4 && le(at, 4) > size) return false;
    if (fixed >= 0) {
      if (static_cast<size_t>(fixed) > left) return true;
      at += fixed;
    } else if (prefix > 0) {
      if (static_cast<size_t>(prefix) > left) return true;
      const uint64_t length = le(at, prefix);
      if (length > left - prefix) return false;
      at += prefix + length;
    } else {
      for (int i = 0; i < lines; ++i) {
        const void* end = std::memchr(data + at, '\n', size - at);
        if (end == nullptr) return true;
        at = static_cast<size_t>(static_cast<const char*>(end) - data) + 1;
      }
    }
  }
  return true;
}

}  // namespace

c10::IValue read_pickled(const std::vector<char>& bytes, const std::string& path, bool* has_digest) {
  const std::string unreadable = "conveyor: '" + path + "' is not a readable checkpoint (truncated or not one)";
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  try {
    // The records are stored uncompressed: one that claims more bytes than the
    // file has is damaged (and reading it would first allocate all of them).
    if (!zip_records_fit(bytes)) throw std::invalid_argument("a record outsizes the file");
    // What torch::pickle_load does, with the bounded reader.
    reader = std::make_unique<caffe2::serialize::PyTorchStreamReader>(std::make_shared<BoundedReader>(bytes));
  } catch (const std::exception&) {
    throw std::invalid_argument(unreadable);
  }
  *has_digest = check_digest(*reader, path);
  c10::IValue value;
  try {
    if (reader->hasRecord("data.pkl")) {
      const auto [pickle, pickle_size] = reader->getRecord("data.pkl");
      if (!pickle_lengths_fit(static_cast<const char*>(pickle.get()), pickle_size)) {
        throw std::invalid_argument("a length or memo id in the pickle outsizes it");
      }
    }
    // Each tensor record as a storage of the bytes it has: left to itself the
    // unpickler sizes a storage by the element count the pickle declares, so a
    // tensor could then reach past its record (a SEGV, or other memory read
    // as weights); checked::to_tensor refuses one that reaches past these.
    auto storages = std::make_shared<torch::jit::DeserializationStorageContext>();
    for (const std::string& record : reader->getAllRecords()) {
      if (record.rfind("data/", 0) != 0) continue;
      auto [data, size] = reader->getRecord(record);
      storages->addStorage(record.substr(5), c10::Storage(c10::Storage::use_byte_size_t(), size, std::move(data),
                                                          /*allocator=*/nullptr, /*resizable=*/false));
    }
    value = torch::jit::readArchiveAndTensors("data", /*pickle_prefix=*/"", /*tensor_prefix=*/"",
                                              /*type_resolver=*/std::nullopt, /*obj_loader=*/std::nullopt,
                                              /*device=*/std::nullopt, *reader,
                                              torch::jit::Unpickler::defaultTypeParser, storages);
  } catch (const std::exception& e) {
    // LibTorch's reason, first line only (its messages carry a C++ backtrace).
    const std::string reason = e.what();
    throw std::invalid_argument(unreadable + ": " + reason.substr(0, reason.find('\n')));
  }
  return value;
}

Dict read_checkpoint(const std::vector<char>& bytes, const std::string& path) {
  bool has_digest = false;
  const c10::IValue value = read_pickled(bytes, path, &has_digest);
  if (!value.isGenericDict() || !value.toGenericDict().contains("format") ||
      value.toGenericDict().at("format") != c10::IValue(kCheckpointFormat)) {
    throw std::invalid_argument("conveyor: '" + path + "' is not a conveyor checkpoint (no format \"" +
                                std::string(kCheckpointFormat) + "\")");
  }
  const std::string what = "conveyor: checkpoint '" + path + "' is damaged: ";
  Dict d = checked::to_dict(value, "the file", what);
  const int64_t version = checked::int_field(d, "version", what);
  check_argument(version <= kCheckpointVersion, "conveyor: checkpoint '", path, "' has format version ", version,
                 "; this build reads up to ", kCheckpointVersion);
  if (version >= 3 && !has_digest) {
    throw std::invalid_argument("conveyor: checkpoint '" + path + "' is damaged: it has lost the digest of its " +
                                "content; nothing was loaded");
  }
  return d;
}

bool CheckpointTarget::every_stage_local() const {
  return std::all_of(stages.begin(), stages.end(), [](const Stage& s) { return s.local; });
}

std::vector<at::Tensor> model_values(const Dict& model, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                     const std::string& what, const std::string& damaged, bool exactly) {
  std::vector<at::Tensor> values;
  for (const auto& [name, t] : tensors) {
    if (!checked::has(model, name)) {
      throw std::invalid_argument(what + "is of a different model: it has no '" + name + "' (shape " + shape(t) + ")");
    }
    const at::Tensor saved = checked::tensor_field(model, name, damaged + "model ");
    if (!saved.sizes().equals(t.sizes())) {
      throw std::invalid_argument(what + "is of a different model: '" + name + "' has shape " + shape(saved) +
                                  " there and " + shape(t) + " here");
    }
    values.push_back(saved.to(t.dtype()));
  }
  if (exactly && model.size() != tensors.size()) {
    for (const auto& entry : model) {
      const std::string& name = entry.key().toStringRef();
      const bool known = std::any_of(tensors.begin(), tensors.end(), [&](const auto& t) { return t.first == name; });
      if (!known) throw std::invalid_argument(what + "is of a different model: this one has no '" + name + "'");
    }
  }
  return values;
}


namespace {

// Stage k's own random streams, checked on copies of generators like theirs.
StageRandom::State stage_random_state(const Dict& r, const c10::Device& device, const std::string& what,
                                      const std::string& damaged, int k) {
  const std::string name = c10::str("stage ", k, " rng ");
  StageRandom::State state{checked::tensor_field(r, "cpu", damaged + name),
                           checked::has_value(r, "device") ? checked::tensor_field(r, "device", damaged + name)
                                                           : at::Tensor()};
  check_argument(state.device.defined() == !device.is_cpu(), what, "holds random streams of stage ", k,
                 " for another kind of device than ", device.str());
  state.cpu = checked::generator_state(at::detail::getDefaultCPUGenerator(), state.cpu, "cpu", damaged + name);
  if (state.device.defined()) {
    state.device = checked::generator_state(at::globalContext().defaultGenerator(device), state.device, "device",
                                            damaged + name);
  }
  return state;
}

}  // namespace

ParameterNamer parameter_namer(const std::map<const void*, std::string>& names, const std::string& optimizer) {
  return [&names, optimizer](const at::Tensor& p) {
    const auto it = names.find(p.unsafeGetTensorImpl());
    if (it == names.end()) {
      throw std::invalid_argument("conveyor: " + optimizer + " holds a tensor of shape " + shape(p) +
                                  " that is not a parameter of the pipeline");
    }
    return it->second;
  };
}

CheckedCheckpoint decode_checkpoint(const std::vector<char>& bytes, const std::string& path,
                                    const CheckpointTarget& target) {
  return decode_checkpoint(read_checkpoint(bytes, path), path, target);
}

CheckedCheckpoint decode_checkpoint(const Dict& d, const std::string& path, const CheckpointTarget& target) {
  const std::string what = "conveyor: checkpoint '" + path + "' ";
  const std::string damaged = what + "is damaged: ";
  CheckedCheckpoint out;
  const int64_t stages = checked::int_field(d, "num_stages", damaged);
  const List saved_stages = checked::list_field(d, "stages", damaged);
  if (stages != target.num_stages || target.every_stage_local()) {
    // One process's file: it has what that process ran only.
    for (size_t k = 0; k < saved_stages.size(); ++k) {
      const Dict s = checked::to_dict(saved_stages.get(k), c10::str("stage ", k), damaged);
      if (checked::has(s, "local") && !checked::to_bool(s.at("local"), "local", damaged)) {
        throw std::invalid_argument(c10::str(what, "holds only the stages one process ran (not stage ", k, " of ",
                                             stages, "): load every process's file together "
                                             "(load_checkpoint_files)"));
      }
    }
  }
  out.values = model_values(checked::dict_field(d, "model", damaged), target.tensors, what, damaged,
                            target.every_stage_local());
  const List saved_optimizers = checked::list_field(d, "optimizers", damaged);
  check_argument(saved_optimizers.size() == target.optimizers.size(), what, "holds ", saved_optimizers.size(),
                 " optimizer states, but ", target.optimizers.size(), " optimizers were given");
  for (size_t i = 0; i < target.optimizers.size(); ++i) {
    TORCH_CHECK(target.optimizers[i] != nullptr, "conveyor: optimizer ", i, " is null");
    const Dict saved = checked::to_dict(saved_optimizers.get(i), optimizer_label(i), damaged);
    out.restore_optimizers.push_back(optimizer_state_restorer(*target.optimizers[i], saved,
                                                              parameter_namer(target.names, optimizer_label(i)),
                                                              damaged + optimizer_label(i) + ": "));
  }
  // Each stage's own optimizer, progress and random streams (format 2; a
  // version 1 file has none, and fits only a pipeline without them).
  check_argument(static_cast<int64_t>(saved_stages.size()) == stages, damaged, "it has ", saved_stages.size(),
                 " stages' entries for ", stages, " stages");
  out.updates.assign(target.num_stages, 0);
  out.random.resize(target.num_stages);
  if (stages != target.num_stages) {  // another split: what is per stage is regrouped
    ResharedStages regrouped = reshard_stages(saved_stages, target, what, damaged);
    out.updates.assign(target.num_stages, regrouped.updates);
    for (auto& restore : regrouped.restore) out.restore_optimizers.push_back(std::move(restore));
  }
  for (int k = 0; k < target.num_stages && stages == target.num_stages; ++k) {
    const CheckpointTarget::Stage& stage = target.stages[k];
    if (!stage.local) continue;
    const std::string label = c10::str("stage ", k);
    const Dict s = checked::to_dict(saved_stages.get(k), label, damaged);
    if (checked::has(s, "local") && !checked::to_bool(s.at("local"), label + " local", damaged)) {
      throw std::invalid_argument(c10::str(what, "was saved by the process that does not run stage ", k,
                                           "; load the file that this stage's process saved"));
    }
    if (checked::has(s, "updates")) out.updates[k] = checked::int_field(s, "updates", damaged + label + " ");
    if (out.updates[k] < 0) throw std::invalid_argument(damaged + label + " has a negative update count");
    std::function<void()> restore = stage_optimizer_restorer(s, stage, k, target.names, what, damaged);
    if (restore) out.restore_optimizers.push_back(std::move(restore));
    // Its own random streams (PipelineOptions::stage_rng).
    const bool saved_rng = checked::has_value(s, "rng");
    if (stage.random.has_value() != saved_rng) {
      throw std::invalid_argument(c10::str(what, saved_rng ? "holds" : "holds no", " random streams of stage ", k,
                                           ", but this pipeline was built ", stage.random ? "with" : "without",
                                           " PipelineOptions::stage_rng"));
    }
    if (stage.random) {
      out.random[k] = stage_random_state(checked::dict_field(s, "rng", damaged), *stage.random, what, damaged, k);
    }
  }
  out.completed_steps = checked::has(d, "completed_steps") ? checked::int_field(d, "completed_steps", damaged) : 0;
  if (out.completed_steps < 0) throw std::invalid_argument(damaged + "it has a negative completed step count");
  // The global generators: the CPU's, then as many CUDA devices' as both have.
  const Dict rng = checked::dict_field(d, "rng", damaged);
  const List cuda = checked::list_field(rng, "cuda", damaged + "rng ");
  for (size_t i = 0; i < target.generators.size() && i <= cuda.size(); ++i) {
    const std::string name = i == 0 ? "cpu" : c10::str("cuda[", i - 1, "]");
    const at::Tensor saved = i == 0 ? checked::tensor_field(rng, "cpu", damaged + "rng ")
                                    : checked::to_tensor(cuda.get(i - 1), name, damaged + "rng ");
    const at::Tensor state = checked::generator_state(target.generators[i], saved, name, damaged + "rng ");
    out.generator_states.push_back(state);
  }
  // The loss scaler's state (PipelineOptions::loss_scaling), if it had one.
  if (checked::has_value(d, "loss_scaler")) {
    const Dict scaler = checked::dict_field(d, "loss_scaler", damaged);
    LossScalerState state;
    state.scale = checked::to_double(checked::field(scaler, "scale", damaged), "scale", damaged + "loss_scaler ");
    state.growth_tracker = checked::int_field(scaler, "growth_tracker", damaged + "loss_scaler ");
    if (!(state.scale > 0) || !std::isfinite(state.scale) || state.growth_tracker < 0) {
      throw std::invalid_argument(c10::str(damaged, "its loss scaler has scale ", state.scale, " and growth tracker ",
                                           state.growth_tracker));
    }
    out.loss_scaler = state;
  }
  out.step = checked::int_field(d, "step", damaged);
  return out;
}

void apply_checkpoint(const CheckedCheckpoint& checked, const CheckpointTarget& target) {
  {
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < target.tensors.size(); ++i) target.tensors[i].second.copy_(checked.values[i]);
  }
  for (const auto& restore : checked.restore_optimizers) restore();
  for (size_t i = 0; i < checked.generator_states.size(); ++i) {
    at::Generator gen = target.generators[i];
    const std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(checked.generator_states[i]);
  }
}

}  // namespace conveyor
