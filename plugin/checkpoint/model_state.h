#pragma once
// A model's weights by its own names, outside any pipeline: a plain state
// dict ({name: tensor}: every parameter and buffer, on the CPU) that
// Python's torch.load reads as a dict (`model.load_state_dict(torch.load(p))`)
// and C++ reads with load_model_state (or torch::pickle_load).
//
//   conveyor::save_model_state("model.pt", pipe);  // or a torch::nn::Module
//   auto model = make_model();                      // unsplit
//   conveyor::load_model_state("model.pt", *model);
//   conveyor::load_model_state("run.ckpt", *model); // a checkpoint's weights, at any stage count
//   conveyor::load_model_state_files(rank_files, *model);  // a multi-process run's files
//   conveyor::export_model_state(rank_files, "model.pt");   // the plain state dict of them
//   conveyor::save_model_archive("model.ts", *model);       // torch::load(model, "model.ts")
//
// Written atomically, with the checkpoint's digest of its content (torch.load
// ignores it); read with every size bounded by the file's.

#include "plugin/runner/stage_runner.h"

#include <torch/nn/module.h>

#include <string>
#include <vector>

namespace conveyor {

// The pipeline's model (its stages' layers by their names in the original
// model) or a module. A pipeline across processes holds some stages only:
// gather its model first (DistributedRunner::gather_model) and save that.
void save_model_state(const std::string& path, const StageRunner& pipe);
void save_model_state(const std::string& path, const torch::nn::Module& model);
// A state dict as given, e.g. Pipeline::state_dict(): the model's own
// keys (a tied weight under each of its names, no non-persistent buffers),
// which the unsplit model's load_state_dict reads strictly.
void save_model_state(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& state);

// Copies the weights in `path` (a plain state dict, this module's or
// torch.save's, or a Conveyor checkpoint of any number of stages) into
// `model`'s parameters and buffers of the same names. Throws
// std::invalid_argument naming the first name or shape that differs, or for
// a file that is neither; nothing is changed then.
void load_model_state(const std::string& path, torch::nn::Module& model);
// The same for a checkpoint that several processes wrote, one file each
// (every rank's file of one step: load_checkpoint_files).
void load_model_state_files(const std::vector<std::string>& paths, torch::nn::Module& model);

// Writes the plain state dict ({name: tensor}, as save_model_state) of the
// model whose checkpoint `paths` hold: one file or every process's file of a
// multi-process pipeline, at any number of stages and replicas. Python reads
// it with torch.load, C++ with load_model_state.
void export_model_state(const std::vector<std::string>& paths, const std::string& out);

// `model`'s parameters and buffers in torch::save's format (a TorchScript
// archive of nested modules), atomically: torch::load(model, path) reads it
// back into a module of the same structure in C++, torch.jit.load(path)
// .state_dict() gives the plain state dict in Python.
void save_model_archive(const std::string& path, const torch::nn::Module& model);

}  // namespace conveyor
