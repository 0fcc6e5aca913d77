#include "plugin/checkpoint/checkpoint.h"

#include "plugin/checkpoint/checkpoint_decode.h"
#include "plugin/checkpoint/checkpoint_file.h"
#include "plugin/checkpoint/checkpoint_set.h"
#include "plugin/checkpoint/checkpoint_values.h"
#include "plugin/checkpoint/optimizer_state.h"
#include "plugin/model/model_snapshot.h"
#include "plugin/model/sharded_state.h"
#include "plugin/model/stage.h"
#include "plugin/model/model_names.h"
#include "plugin/core/option_values.h"
#include "plugin/support/atomic_file.h"

#include <ATen/Context.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <torch/serialize.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

namespace conveyor {

namespace {

using namespace checkpoint_values;


// Every tensor an optimizer may hold, by its model name: the layers'
// parameters and, where weight stashing keeps them apart, the live weights.
std::map<const void*, std::string> names_by_tensor(const StageRunner& pipe) {
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


// --- random number generators --------------------------------------------------

Dict rng_to_dict() {
  const auto gens = default_generators();
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

// --- the file ------------------------------------------------------------------

// `v` with its lists and dicts untyped: torch.load's weights-only unpickler
// refuses the typed lists (build_intlist) that TorchScript pickles.
c10::IValue untyped(const c10::IValue& v) {
  if (v.isList()) {
    List out = new_list();
    for (const c10::IValue& item : v.toListRef()) out.push_back(untyped(item));
    return out;
  }
  if (v.isGenericDict()) {
    Dict out = new_dict();
    for (const auto& entry : v.toGenericDict()) out.insert(entry.key(), untyped(entry.value()));
    return out;
  }
  return v;
}

// Every option Python can give, named and valued as Python gives it (the
// timeout in seconds): a record of how the pipeline ran, which loading does
// not read.
Dict options_to_dict(const StageRunner& pipe) {
  Dict d = new_dict();
  for_each_option(pipe.options(), [&](const OptionSpec& spec, const auto& value) {
    using T = std::decay_t<decltype(value)>;
    if constexpr (OptionValue<T>::reachable) d.insert(spec.name, untyped(OptionValue<T>::write(value)));
  });
  return d;
}

// With the parameters sharded (shard "parameters"), the local stages'
// weights whole while a checkpoint reads or writes them: gathered from every
// replica's pieces to be saved (collective: every replica saves), or given
// storage to be loaded, then taken as the pieces. Released again after,
// unless they were whole before.
class WholeWeights {
 public:
  enum class For { kSaving, kLoading };
  WholeWeights(const StageRunner& pipe, For use) {
    for (ShardedState* shards : local_parameter_shards(pipe)) {
      held_.emplace_back(shards, shards->parameters_whole());
      if (use == For::kSaving) {
        shards->gather_parameters();
      } else {
        shards->allocate_parameters();
      }
    }
  }
  // The loaded weights become the pieces.
  void loaded() {
    for (auto& [shards, was_whole] : held_) shards->shard_parameters();
    held_.clear();
  }
  ~WholeWeights() {
    for (auto& [shards, was_whole] : held_) {
      if (!was_whole) shards->release_parameters();
    }
  }
  WholeWeights(const WholeWeights&) = delete;
  WholeWeights& operator=(const WholeWeights&) = delete;

 private:
  std::vector<std::pair<ShardedState*, bool>> held_;
};

}  // namespace

void save_checkpoint(const std::string& path, const StageRunner& pipe, const TrainingState& state) {
  Dict d = new_dict();
  d.insert("format", kCheckpointFormat);
  d.insert("version", kCheckpointVersion);
  d.insert("step", state.step);
  d.insert("num_stages", int64_t{pipe.num_stages()});
  d.insert("schedule", pipe.schedule().str());
  d.insert("options", options_to_dict(pipe));
  d.insert("completed_steps", pipe.completed_steps());
  const auto names = names_by_tensor(pipe);
  const WholeWeights whole(pipe, WholeWeights::For::kSaving);

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
    s.insert("optimizer", c10::IValue());
    s.insert("optimizer_shard", c10::IValue());
    if (torch::optim::Optimizer* own = pipe.stage(k).optimizer()) {
      if (auto* sharded = dynamic_cast<ShardedState*>(own)) {
        // This replica's pieces only: no process holds the whole state.
        const ParameterNamer weight_name = parameter_namer(names, stage_optimizer_label(k));
        Dict o = optimizer_state_to_dict(sharded->shard(), [&](const at::Tensor& piece) {
          return weight_name(sharded->weight_of_piece(piece));
        });
        o.insert_or_assign("stage", int64_t{k});
        Dict part = new_dict();
        part.insert("replica", int64_t{sharded->replica()});
        part.insert("replicas", int64_t{sharded->replicas()});
        part.insert("optimizer", o);
        s.insert_or_assign("optimizer_shard", part);
      } else {
        Dict o = optimizer_state_to_dict(*own, parameter_namer(names, stage_optimizer_label(k)));
        o.insert_or_assign("stage", int64_t{k});
        s.insert_or_assign("optimizer", o);
      }
    }
    stages.push_back(s);
  }
  d.insert("stages", stages);

  List optimizers = new_list();
  for (size_t i = 0; i < state.optimizers.size(); ++i) {
    TORCH_CHECK(state.optimizers[i] != nullptr, "conveyor: optimizer ", i, " is null");
    optimizers.push_back(optimizer_state_to_dict(*state.optimizers[i], parameter_namer(names, optimizer_label(i))));
  }
  d.insert("optimizers", optimizers);
  d.insert("rng", rng_to_dict());
  if (const auto scaler = pipe.loss_scaler_state()) {
    c10::impl::GenericDict sd(c10::StringType::get(), c10::AnyType::get());
    sd.insert("scale", scaler->scale);
    sd.insert("growth_tracker", scaler->growth_tracker);
    d.insert("loss_scaler", sd);
  } else {
    d.insert("loss_scaler", c10::IValue());
  }
  write_atomically(path, checkpoint_bytes(d));
}

namespace {

// load_checkpoint of a checkpoint's dict; `path` names it in messages.
int64_t load_dict(const Dict& d, const std::string& path, StageRunner& pipe,
                  const std::vector<torch::optim::Optimizer*>& optimizers) {
  CheckpointTarget target;
  target.num_stages = pipe.num_stages();
  target.tensors = model_named_parameters(pipe);
  for (auto& b : model_named_buffers(pipe)) target.tensors.push_back(std::move(b));
  target.names = names_by_tensor(pipe);
  // A whole state is restored into an optimizer over the whole weights, of
  // which a sharded stage then takes its part; a part saved by the same
  // replica goes straight into its shard (decode_checkpoint).
  std::vector<std::unique_ptr<torch::optim::Optimizer>> wholes;
  for (int k = 0; k < pipe.num_stages(); ++k) {
    CheckpointTarget::Stage stage;
    stage.local = pipe.is_local(k);
    if (stage.local) {
      stage.optimizer = pipe.stage(k).optimizer();
      if (auto* parts = dynamic_cast<ShardedState*>(stage.optimizer)) {
        wholes.push_back(parts->whole_without_state());
        stage.optimizer = wholes.back().get();
        stage.sharded = parts;
      }
      if (const StageRandom* random = pipe.stage(k).random()) stage.random = random->device();
    }
    target.stages.push_back(stage);
  }
  target.optimizers = optimizers;
  target.generators = default_generators();
  // Everything is checked first: only then is anything changed.
  const CheckedCheckpoint checked = decode_checkpoint(d, path, target);
  WholeWeights whole(pipe, WholeWeights::For::kLoading);
  apply_checkpoint(checked, target);
  whole.loaded();
  for (int k = 0; k < pipe.num_stages(); ++k) {
    if (checked.random[k]) pipe.stage(k).random()->set_state(*checked.random[k]);
  }
  pipe.restore_progress(checked.completed_steps, checked.updates);
  // A file without a scaler (or a pipeline without one) keeps the pipeline's.
  if (checked.loss_scaler && pipe.loss_scaler_state()) pipe.restore_loss_scaler(*checked.loss_scaler);
  return checked.step;
}

}  // namespace

int64_t load_checkpoint(const std::string& path, StageRunner& pipe,
                        const std::vector<torch::optim::Optimizer*>& optimizers) {
  const std::vector<CheckpointFile> file = read_checkpoint_files({path});
  return load_dict(read_checkpoint(file[0].bytes, path), path, pipe, optimizers);
}

int64_t load_checkpoint_files(const std::vector<std::string>& paths, StageRunner& pipe,
                              const std::vector<torch::optim::Optimizer*>& optimizers) {
  return load_dict(merge_checkpoints(read_checkpoint_files(paths)), files_label(paths), pipe, optimizers);
}

void merge_checkpoint_files(const std::vector<std::string>& paths, const std::string& out) {
  write_atomically(out, checkpoint_bytes(merge_checkpoints(read_checkpoint_files(paths))));
}

}  // namespace conveyor
