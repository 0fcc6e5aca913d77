#pragma once
// The checking half of load_checkpoint (plugin/checkpoint/checkpoint.h): reads
// a checkpoint's bytes against what they are to be loaded into and checks all
// of it, changing nothing; what it returns then restores without failing. A
// file that is damaged, foreign or of another model is refused here with
// std::invalid_argument, whatever its bytes. load_checkpoint is this, then
// apply_checkpoint; tests/fuzz/fuzz_checkpoint.cpp feeds it arbitrary bytes.

#include "plugin/checkpoint/optimizer_state.h"
#include "plugin/model/sharded_state.h"
#include "plugin/model/stage_random.h"

#include "plugin/core/types.h"

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace conveyor {

// The file's "format" and the newest "version" this build writes and reads
// (2 added each stage's own optimizer, its update count and the pipeline's
// completed steps: asynchronous schedules resume from them; 3 the digest of
// the content, plugin/checkpoint/checkpoint_file.h; 4 each stage's
// "optimizer_shard": a replica's part of a sharded optimizer's state).
inline constexpr const char* kCheckpointFormat = "conveyor-checkpoint";
inline constexpr int64_t kCheckpointVersion = 4;

// What a checkpoint is loaded into: a pipeline as the loader sees it.
struct CheckpointTarget {
  int num_stages = 0;
  // The parameters, then the buffers, of the local stages by model name
  // (model_named_parameters, model_named_buffers).
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  // Every tensor an optimizer may hold (by TensorImpl) and its model name.
  std::map<const void*, std::string> names;
  struct Stage {
    bool local = true;
    torch::optim::Optimizer* optimizer = nullptr;  // its own (PipelineOptions::optimizer)
    // Its own optimizer's state is split across replicas: `optimizer` is then
    // one over the whole weights (ShardedState::whole_without_state), into
    // which a whole state is restored before this takes its part.
    ShardedState* sharded = nullptr;
    std::optional<c10::Device> random;             // PipelineOptions::stage_rng: its streams' device
  };
  std::vector<Stage> stages;  // num_stages of them
  // Whether every stage is this process's (then the file must hold exactly
  // `tensors`; a process's pipeline checks the names of its own stages only).
  bool every_stage_local() const;
  std::vector<torch::optim::Optimizer*> optimizers;  // the caller's, over the pipeline's parameters
  // The generators whose states the file restores: the CPU's, then each CUDA device's.
  std::vector<at::Generator> generators;
};

// A checked checkpoint: what load_checkpoint restores.
struct CheckedCheckpoint {
  int64_t step = 0;
  int64_t completed_steps = 0;
  std::vector<int64_t> updates;  // per stage
  std::vector<at::Tensor> values;  // per target tensor: its saved value, of its shape
  std::vector<std::function<void()>> restore_optimizers;
  std::vector<std::optional<StageRandom::State>> random;  // per stage
  std::vector<at::Tensor> generator_states;  // the first generator_states.size() target generators'
  std::optional<LossScalerState> loss_scaler;  // the file's, if it has one
};

// A file in torch.save's zip format, read with every size bounded by the
// file's (its digest, if it has one, checked: `has_digest` says whether).
// Throws std::invalid_argument for bytes that are not such a file.
c10::IValue read_pickled(const std::vector<char>& bytes, const std::string& path, bool* has_digest);

// The saved values of `tensors` in `model` ({name: tensor}), each of its
// tensor's shape and dtype: the same names and shapes (both ways with
// `exactly`; else `model` may hold more), or std::invalid_argument prefixed
// with `what` naming the first mismatch.
std::vector<at::Tensor> model_values(const c10::impl::GenericDict& model,
                                     const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                     const std::string& what, const std::string& damaged, bool exactly = true);

// A checkpoint file's dict: read_pickled, its format and version checked.
// Throws std::invalid_argument for bytes that are not a checkpoint.
c10::impl::GenericDict read_checkpoint(const std::vector<char>& bytes, const std::string& path);

// Names an optimizer's tensors by `names` (CheckpointTarget::names); throws
// std::invalid_argument, naming `optimizer`, for one the pipeline does not have.
ParameterNamer parameter_namer(const std::map<const void*, std::string>& names, const std::string& optimizer);

// Unpickles and checks `bytes` (a checkpoint file's; `path` names it in
// messages). Throws std::invalid_argument for bytes that are not a checkpoint,
// a checkpoint of another model, stage count or optimizers, or any value of
// the wrong type or shape.
CheckedCheckpoint decode_checkpoint(const std::vector<char>& bytes, const std::string& path,
                                    const CheckpointTarget& target);
// The same for a checkpoint's dict (read_checkpoint's, or several files'
// merged: plugin/checkpoint/checkpoint_set.h); `path` names it in messages.
CheckedCheckpoint decode_checkpoint(const c10::impl::GenericDict& d, const std::string& path,
                                    const CheckpointTarget& target);

// Writes a checked checkpoint's tensors, optimizer states and generator states
// into the target (the stages' streams and progress are the pipeline's to set).
void apply_checkpoint(const CheckedCheckpoint& checked, const CheckpointTarget& target);

}  // namespace conveyor
