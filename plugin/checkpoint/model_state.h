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
//
// Written atomically, with the checkpoint's digest of its content (torch.load
// ignores it); read with every size bounded by the file's.

#include "plugin/pipeline.h"

#include <torch/nn/module.h>

#include <string>

namespace conveyor {

// The pipeline's model (its stages' layers by their names in the original
// model) or a module. A pipeline across processes holds some stages only:
// gather its model first (DistributedPipeline::gather_model) and save that.
void save_model_state(const std::string& path, const Pipeline& pipe);
void save_model_state(const std::string& path, const torch::nn::Module& model);

// Copies the weights in `path` (a plain state dict, this module's or
// torch.save's, or a Conveyor checkpoint of any number of stages) into
// `model`'s parameters and buffers of the same names. Throws
// std::invalid_argument naming the first name or shape that differs, or for
// a file that is neither; nothing is changed then.
void load_model_state(const std::string& path, torch::nn::Module& model);

}  // namespace conveyor
