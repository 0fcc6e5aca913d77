#include "plugin/checkpoint/checkpoint.h"

#include "plugin/atomic_file.h"
#include "plugin/checkpoint/checkpoint_file.h"
#include "plugin/checkpoint/optimizer_state.h"
#include "plugin/model_names.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>
#include <torch/serialize.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>

namespace conveyor {

namespace {

using Dict = c10::impl::GenericDict;
using List = c10::impl::GenericList;
constexpr const char* kFormat = "conveyor-checkpoint";
// 2 added each stage's own optimizer, its update count and the pipeline's
// completed steps (asynchronous schedules resume from them); 3 the digest of
// the content (checkpoint_file.h).
constexpr int64_t kVersion = 3;

Dict new_dict() { return Dict(c10::StringType::get(), c10::AnyType::get()); }
List new_list() { return List(c10::AnyType::get()); }

template <typename T>
List list_of(const std::vector<T>& items) {
  List list = new_list();
  for (const auto& item : items) list.push_back(item);
  return list;
}

at::Tensor to_cpu(const at::Tensor& t) { return t.detach().to(at::kCPU); }

std::string shape(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

// Every tensor an optimizer may hold, by its model name: the layers'
// parameters and, where weight stashing keeps them apart, the live weights.
std::map<const void*, std::string> names_by_tensor(const Pipeline& pipe) {
  std::map<const void*, std::string> names;
  for (int k = 0; k < pipe.num_stages(); ++k) {
    if (!pipe.is_local(k)) continue;
    const auto named = model_named_parameters(pipe.stage(k));
    const auto& live = pipe.stage(k).live();
    for (size_t i = 0; i < named.size(); ++i) {
      names[named[i].second.unsafeGetTensorImpl()] = named[i].first;
      if (i < live.size()) names[live[i].unsafeGetTensorImpl()] = named[i].first;
    }
  }
  return names;
}

ParameterNamer namer(const std::map<const void*, std::string>& names, const std::string& optimizer) {
  return [&names, optimizer](const at::Tensor& p) {
    const auto it = names.find(p.unsafeGetTensorImpl());
    if (it == names.end()) {
      throw std::invalid_argument("conveyor: " + optimizer + " holds a tensor of shape " + shape(p) +
                                  " that is not a parameter of the pipeline");
    }
    return it->second;
  };
}

std::string optimizer_label(size_t i) { return "optimizer " + std::to_string(i); }
std::string stage_optimizer_label(int k) { return "stage " + std::to_string(k) + "'s optimizer"; }

// --- random number generators --------------------------------------------------

std::vector<at::Generator> generators() {
  std::vector<at::Generator> gens{at::detail::getDefaultCPUGenerator()};
  if (torch::cuda::is_available()) {
    for (c10::DeviceIndex i = 0; i < static_cast<c10::DeviceIndex>(torch::cuda::device_count()); ++i) {
      gens.push_back(at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, i)));
    }
  }
  return gens;
}

Dict rng_to_dict() {
  const auto gens = generators();
  Dict d = new_dict();
  List cuda = new_list();
  for (size_t i = 0; i < gens.size(); ++i) {
    at::Generator gen = gens[i];
    std::lock_guard<std::mutex> lock(gen.mutex());
    if (i == 0)
      d.insert("cpu", gen.get_state());
    else
      cuda.push_back(gen.get_state());
  }
  d.insert("cuda", cuda);
  return d;
}

void restore_rng(const Dict& d) {
  const auto gens = generators();
  const List cuda = d.at("cuda").toList();
  for (size_t i = 0; i < gens.size() && i <= cuda.size(); ++i) {
    at::Generator gen = gens[i];
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(i == 0 ? d.at("cpu").toTensor() : cuda.get(i - 1).toTensor());
  }
}

// --- the file ------------------------------------------------------------------

Dict options_to_dict(const Pipeline& pipe) {
  const PipelineOptions& o = pipe.options();
  Dict d = new_dict();
  d.insert("stages", int64_t{o.stages()});
  d.insert("microbatches", int64_t{o.microbatches()});
  d.insert("schedule", o.schedule());
  d.insert("schedule_text", o.schedule_text());
  d.insert("devices", list_of(o.devices()));
  d.insert("boundaries", list_of(o.boundaries()));
  d.insert("balance", o.balance() == Balance::kUniform ? "uniform" : "parameters");
  d.insert("batch_dim", o.batch_dim());
  d.insert("loss_reduction", o.loss_reduction() == LossReduction::kMean ? "mean" : "sum");
  d.insert("channel_capacity", int64_t{o.channel_capacity()});
  d.insert("timeout_ms", static_cast<int64_t>(o.timeout().count()));
  d.insert("stage_rng", o.stage_rng());
  return d;
}

Dict read_checkpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("conveyor: cannot read checkpoint '" + path + "': no such file");
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  bool has_digest = false;
  const c10::IValue value = read_checkpoint_bytes(bytes, path, has_digest);
  if (!value.isGenericDict() || !value.toGenericDict().contains("format") ||
      value.toGenericDict().at("format") != c10::IValue(kFormat)) {
    throw std::invalid_argument("conveyor: '" + path + "' is not a conveyor checkpoint (no format \"" + kFormat +
                                "\")");
  }
  Dict d = value.toGenericDict();
  if (d.at("version").toInt() > kVersion) {
    throw std::invalid_argument("conveyor: checkpoint '" + path + "' has format version " +
                                std::to_string(d.at("version").toInt()) + "; this build reads up to " +
                                std::to_string(kVersion));
  }
  if (d.at("version").toInt() >= 3 && !has_digest) {
    throw std::invalid_argument("conveyor: checkpoint '" + path + "' is damaged: it has lost the digest of its " +
                                "content; nothing was loaded");
  }
  return d;
}

}  // namespace

void save_checkpoint(const std::string& path, const Pipeline& pipe, const TrainingState& state) {
  Dict d = new_dict();
  d.insert("format", kFormat);
  d.insert("version", kVersion);
  d.insert("step", state.step);
  d.insert("num_stages", int64_t{pipe.num_stages()});
  d.insert("schedule", pipe.schedule().str());
  d.insert("options", options_to_dict(pipe));
  d.insert("completed_steps", pipe.completed_steps());
  const auto names = names_by_tensor(pipe);

  Dict model = new_dict();
  for (const auto& [name, t] : model_named_parameters(pipe)) model.insert(name, to_cpu(t));
  for (const auto& [name, t] : model_named_buffers(pipe)) model.insert(name, to_cpu(t));
  d.insert("model", model);

  List stages = new_list();
  for (int k = 0; k < pipe.num_stages(); ++k) {
    Dict s = new_dict();
    s.insert("local", pipe.is_local(k));
    if (!pipe.is_local(k)) {  // saved by the process that runs it
      stages.push_back(s);
      continue;
    }
    s.insert("device", pipe.stage(k).device().str());
    s.insert("first_layer", pipe.stage(k).first_layer());
    s.insert("num_layers", pipe.stage(k).num_layers());
    List params = new_list(), buffers = new_list();
    for (const auto& p : model_named_parameters(pipe.stage(k))) params.push_back(p.first);
    for (const auto& b : model_named_buffers(pipe.stage(k))) buffers.push_back(b.first);
    s.insert("parameters", params);
    s.insert("buffers", buffers);
    s.insert("updates", pipe.stage(k).updates());
    if (const StageRandom* random = pipe.stage(k).random()) {
      Dict r = new_dict();
      r.insert("cpu", random->state().cpu);
      r.insert("device", random->state().device.defined() ? c10::IValue(random->state().device) : c10::IValue());
      s.insert("rng", r);
    } else {
      s.insert("rng", c10::IValue());
    }
    if (torch::optim::Optimizer* own = pipe.stage(k).optimizer()) {
      Dict o = optimizer_state_to_dict(*own, namer(names, stage_optimizer_label(k)));
      o.insert_or_assign("stage", int64_t{k});
      s.insert("optimizer", o);
    } else {
      s.insert("optimizer", c10::IValue());
    }
    stages.push_back(s);
  }
  d.insert("stages", stages);

  List optimizers = new_list();
  for (size_t i = 0; i < state.optimizers.size(); ++i) {
    TORCH_CHECK(state.optimizers[i] != nullptr, "conveyor: optimizer ", i, " is null");
    optimizers.push_back(optimizer_state_to_dict(*state.optimizers[i], namer(names, optimizer_label(i))));
  }
  d.insert("optimizers", optimizers);
  d.insert("rng", rng_to_dict());
  write_atomically(path, checkpoint_bytes(d));
}

int64_t load_checkpoint(const std::string& path, Pipeline& pipe,
                        const std::vector<torch::optim::Optimizer*>& optimizers) {
  const Dict d = read_checkpoint(path);
  const std::string what = "conveyor: checkpoint '" + path + "' ";
  const int64_t stages = d.at("num_stages").toInt();
  if (stages != pipe.num_stages()) {
    throw std::invalid_argument(what + "is of a pipeline of " + std::to_string(stages) + " stages, this one has " +
                                std::to_string(pipe.num_stages()) + "; resume with the same number of stages");
  }
  // The model's signature: the same names and shapes, both ways.
  const Dict model = d.at("model").toGenericDict();
  auto tensors = model_named_parameters(pipe);
  for (auto& b : model_named_buffers(pipe)) tensors.push_back(std::move(b));
  for (const auto& [name, t] : tensors) {
    if (!model.contains(name)) {
      throw std::invalid_argument(what + "is of a different model: it has no '" + name + "' (shape " + shape(t) + ")");
    }
    const at::Tensor saved = model.at(name).toTensor();
    if (!saved.sizes().equals(t.sizes())) {
      throw std::invalid_argument(what + "is of a different model: '" + name + "' has shape " + shape(saved) +
                                  " there and " + shape(t) + " here");
    }
  }
  if (model.size() != tensors.size()) {
    for (const auto& entry : model) {
      const std::string& name = entry.key().toStringRef();
      const bool known = std::any_of(tensors.begin(), tensors.end(), [&](const auto& t) { return t.first == name; });
      if (!known) throw std::invalid_argument(what + "is of a different model: this one has no '" + name + "'");
    }
  }
  const List saved_optimizers = d.at("optimizers").toList();
  if (saved_optimizers.size() != optimizers.size()) {
    throw std::invalid_argument(what + "holds " + std::to_string(saved_optimizers.size()) + " optimizer states, but " +
                                std::to_string(optimizers.size()) + " optimizers were given");
  }
  const auto names = names_by_tensor(pipe);
  std::vector<std::function<void()>> restore;
  for (size_t i = 0; i < optimizers.size(); ++i) {
    TORCH_CHECK(optimizers[i] != nullptr, "conveyor: optimizer ", i, " is null");
    restore.push_back(optimizer_state_restorer(*optimizers[i], saved_optimizers.get(i).toGenericDict(),
                                               namer(names, optimizer_label(i)),
                                               "conveyor: " + optimizer_label(i) + ": "));
  }
  // Each stage's own optimizer, progress and random streams (format 2; a
  // version 1 file has none, and fits only a pipeline without them).
  const List saved_stages = d.at("stages").toList();
  std::vector<int64_t> updates(pipe.num_stages(), 0);
  for (int k = 0; k < pipe.num_stages(); ++k) {
    if (!pipe.is_local(k)) continue;
    const Dict s = saved_stages.get(k).toGenericDict();
    if (s.contains("local") && !s.at("local").toBool()) {
      throw std::invalid_argument(what + "was saved by the process that does not run stage " + std::to_string(k) +
                                  "; load the file that this stage's process saved");
    }
    if (s.contains("updates")) updates[k] = s.at("updates").toInt();
    torch::optim::Optimizer* own = pipe.stage(k).optimizer();
    const bool saved_own = s.contains("optimizer") && !s.at("optimizer").isNone();
    if ((own != nullptr) != saved_own) {
      throw std::invalid_argument(what + (saved_own ? "holds" : "holds no") + " state of stage " + std::to_string(k) +
                                  "'s own optimizer, but this pipeline " + (own ? "has" : "has no") +
                                  " such optimizer (PipelineOptions::optimizer)");
    }
    if (own) {
      restore.push_back(optimizer_state_restorer(*own, s.at("optimizer").toGenericDict(),
                                                 namer(names, stage_optimizer_label(k)),
                                                 "conveyor: " + stage_optimizer_label(k) + ": "));
    }
    // Its own random streams (PipelineOptions::stage_rng).
    const bool saved_rng = s.contains("rng") && !s.at("rng").isNone();
    StageRandom* random = pipe.stage(k).random();
    if ((random != nullptr) != saved_rng) {
      throw std::invalid_argument(what + (saved_rng ? "holds" : "holds no") + " random streams of stage " +
                                  std::to_string(k) + ", but this pipeline was built " + (random ? "with" : "without") +
                                  " PipelineOptions::stage_rng");
    }
    if (random) {
      const Dict r = s.at("rng").toGenericDict();
      StageRandom::State state{r.at("cpu").toTensor(),
                               r.at("device").isNone() ? at::Tensor() : r.at("device").toTensor()};
      if (state.device.defined() != !random->device().is_cpu()) {
        throw std::invalid_argument(what + "holds random streams of stage " + std::to_string(k) +
                                    " for another kind of device than " + random->device().str());
      }
      restore.push_back([random, state] { random->set_state(state); });
    }
  }
  const int64_t completed = d.contains("completed_steps") ? d.at("completed_steps").toInt() : 0;
  // Everything matches: only now is anything changed.
  {
    torch::NoGradGuard no_grad;
    for (const auto& [name, t] : tensors) t.copy_(model.at(name).toTensor());
  }
  for (const auto& r : restore) r();
  pipe.restore_progress(completed, updates);
  restore_rng(d.at("rng").toGenericDict());
  return d.at("step").toInt();
}

}  // namespace conveyor
