#pragma once
// Checkpoints: a pipeline's whole training state in one file, so that a run
// can stop and resume with the next step bit for bit what it would have been.
//
//   conveyor::save_checkpoint("run.ckpt", pipe, {step, {&opt}});
//   ...  // a new process: same model, same options, a fresh optimizer
//   const int64_t step = conveyor::load_checkpoint("run.ckpt", pipe, {&opt});
//
// The file is the zip format of torch::pickle_save, which Python's
// torch.load reads as a dict:
//   format        "conveyor-checkpoint", version 4
//   step          the caller's step count
//   completed_steps  Pipeline::completed_steps()
//   num_stages    K
//   schedule      the schedule in text form; options: the PipelineOptions
//   model         {name: tensor}: every parameter and buffer, named as the
//                 original model names them (model_named_parameters), on CPU
//   stages        per stage: {"local", "device", "first_layer", "num_layers",
//                 "parameters": [names], "buffers": [names], "updates": the
//                 stage's optimizer steps, "optimizer": the state of the
//                 stage's own optimizer (PipelineOptions::optimizer) or None,
//                 "optimizer_shard": a replica's part of it when it is sharded
//                 (below) or None,
//                 "rng": the stage's own random streams {"cpu", "device"}
//                 (PipelineOptions::stage_rng) or None}
//                 ("local" false: the stage runs in another process, which
//                 saves it in its own file; only "local" is there then)
//   optimizers    a list, one entry per optimizer: {"type", "stage" (-1: over
//                 the whole pipeline; k: stage k's own), "param_groups":
//                 [{"lr", "params": [names]}], "state": {name: {field: value}}}
//   rng           {"cpu": generator state, "cuda": [state per device]}
//   loss_scaler   {"scale", "growth_tracker"} of the pipeline's loss scaler
//                 (PipelineOptions::loss_scaling), or None; a file without
//                 one leaves the pipeline's scaler as it is. Gradients are
//                 not saved: save at an update, not inside an accumulation.
// The file also holds a digest of its content (plugin/checkpoint/checkpoint_file.h):
// a file changed or cut after it was written is refused, never loaded as other weights.
// Optimizer state is stored by parameter name, so it does not depend on the
// order in which an optimizer was given its parameters. The stages' own
// optimizers (every asynchronous schedule has them) are saved and restored
// with the stages, together with their update counts, which the learning-rate
// schedule reads: an asynchronous run resumes as exactly as a synchronous one.
//
// A pipeline that runs one stage of a multi-process pipeline saves and loads
// that stage only: each process keeps its own file, which it loads back at
// the same layout; load_checkpoint_files puts every process's file together,
// to resume at another number of stages or replicas.
// A stage optimizer whose state is sharded across data-parallel replicas
// (ShardedState, plugin/model/sharded_state.h) saves this replica's part only
// ("optimizer_shard": {"replica", "replicas", "optimizer": the state of its
// flat pieces, by the weights' names}, "optimizer" None): no process gathers
// the whole state, and no collective runs. A part loads back into the same
// replica of as many replicas; the parts of all replicas merged
// (load_checkpoint_files) make the whole state, which loads into any number
// of replicas, sharded or not.
//
// Loading checks that the checkpoint is of this model (the same parameter and
// buffer names and shapes; a process's pipeline checks its own stages'), and
// refuses otherwise. At another number of stages it reshards
// (plugin/checkpoint/checkpoint_reshard.h): each stage's own optimizer gets
// the state of the parameters it now holds; stage-owned random streams,
// unequal update counts and one process's file alone are refused.
//
// Supported optimizers: SGD, Adam, AdamW, Adagrad, RMSprop.

#include "plugin/runner/stage_runner.h"

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>
#include <vector>

namespace conveyor {

struct TrainingState {
  int64_t step = 0;
  // Each over some of the pipeline's parameters (usually one over all).
  std::vector<torch::optim::Optimizer*> optimizers;
};

// Writes path + ".tmp", flushes it to disk and renames it over `path`, so a
// crash while saving leaves the previous checkpoint intact. Throws
// std::runtime_error on I/O failure, std::invalid_argument for an optimizer
// that is not supported or holds a tensor that is not the pipeline's.
void save_checkpoint(const std::string& path, const StageRunner& pipe, const TrainingState& state = {});

// Restores weights, buffers, optimizer states (into `optimizers`, which must
// match the saved ones in number, type and parameters, and into the stages'
// own optimizers), step and update counts, and the random number generators. Returns the saved step. Throws
// std::invalid_argument for a file that is not a checkpoint, a checkpoint of another model or stage count, or
// optimizers that do not match; nothing is changed then.
int64_t load_checkpoint(const std::string& path, StageRunner& pipe,
                        const std::vector<torch::optim::Optimizer*>& optimizers = {});

// A checkpoint that the processes of a multi-process pipeline wrote, one
// file each (every rank's file of one step, in any order): merged in memory
// (plugin/checkpoint/checkpoint_set.h), then loaded as load_checkpoint loads
// one file, at any number of stages and replicas, in-process or into each
// process's stages. Each process reads every file. Throws
// std::invalid_argument, changing nothing, as load_checkpoint does, and for
// files that are not one checkpoint (other steps or pipelines), a stage no
// file holds, or a replica's part of a sharded optimizer state missing, each
// named.
int64_t load_checkpoint_files(const std::vector<std::string>& paths, StageRunner& pipe,
                              const std::vector<torch::optim::Optimizer*>& optimizers = {});

// Writes the checkpoint of the whole pipeline that `paths` (a multi-process
// pipeline's files) make together, atomically: one file that loads at any
// layout (load_checkpoint) and into a plain model (load_model_state).
void merge_checkpoint_files(const std::vector<std::string>& paths, const std::string& out);

}  // namespace conveyor
