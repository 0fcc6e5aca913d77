#pragma once
// torch.export programs in a pipeline: a .pt2 archive (torch.export.save of
// torch.export.export(model, args)) trained in C++, with no Python at run
// time. Each node of the program's graph is an ATen operator called through
// the dispatcher with autograd on, so the backward is autograd's, as in
// eager PyTorch; the graph becomes a torch::nn::Sequential of ExportLayers,
// so the Pipeline, its runtime, every schedule, checkpoints and the
// distributed pipeline run it unchanged:
//
//   conveyor::Pipeline pipe(std::string("lm.pt2"),   // plugin/pipeline.h
//                           PipelineOptions().microbatches(4).split_points({"rnn2", "proj"}));  // cut there
//
// Without split points the layers are the modules the model calls (see
// plugin/export/segments.h) and the options' partition policy (or balance by
// time) chooses the stages. Parameters and buffers keep the model's names
// ("rnn1.weight_ih_l0"). Export in training mode with the batch dimension
// dynamic (dynamic_shapes={"x": {0: Dim("batch")}}) so micro-batches of any
// size run; a static batch is refused with that advice. eval() turns off
// dropout and batch norm's batch statistics as Module.eval() would.
//
// What the interpreter runs: ATen (and any loaded library's) operators with
// arguments of every kind the schema has for them (tensors, lists and
// optional lists of tensors, ints, floats, bools, strings and lists of them,
// symbolic sizes and their arithmetic, dtypes, layouts, memory formats,
// devices); parameters, buffers and lifted constants; buffer mutations in
// place (training graphs) or in the signature (functional graphs). What it
// refuses when the program is loaded, naming the node: higher-order operators
// (cond, while_loop, wrapped subgraphs), operators no loaded library defines,
// custom objects, effect tokens, joint forward-backward graphs.

#include "plugin/export/export_layer.h"
#include "plugin/export/program.h"

#include <torch/nn/modules/container/sequential.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace conveyor {

// A loaded program: its graph and its tensors (parameters and buffers by the
// model's names, on the CPU; constants), shared by the layers made from it.
//
// A tensor the program reads under several names (a tied weight: GPT-2's
// lm_head.weight is transformer.wte.weight) is one parameter, named as
// PyTorch's named_parameters() names it: by its first name, the first among
// `given` (the model's own order) or else in the program's signature. The
// program reads it under that name; `aliases` keeps the others (alias, first
// name), the keys the model's state_dict() also has.
struct ExportedModel {
  std::shared_ptr<const exported::Program> program;
  std::map<std::string, at::Tensor> tensors;
  std::vector<std::pair<std::string, std::string>> aliases;
  std::string path;
};

// Reads a .pt2 archive. `given`: tensors by name that stand for the
// archive's (the caller's model's own parameters and buffers, which the
// pipeline then trains: conveyor.Pipeline passes an nn.Module's), in the
// model's order; the archive supplies the rest. Non-persistent buffers are
// found among the archive's constants, where torch.export.save keeps them.
// Throws std::invalid_argument naming the path and the problem: no such
// file, no zip archive (truncated, corrupt), no ExportedProgram in it (a
// TorchScript archive), a schema version this build does not read, a node it
// cannot run (named, with its operator), weights missing or unreadable, a
// given tensor of another shape or dtype than the program's.
ExportedModel load_exported(const std::string& path,
                            const std::vector<std::pair<std::string, at::Tensor>>& given = {});

// Whether `path` is a zip archive holding an ExportedProgram (a .pt2).
bool holds_exported_program(const std::string& path);

// The program as layers (see above); split points name modules by path.
torch::nn::Sequential sequential_from_export(const ExportedModel& model,
                                             const std::vector<std::string>& split_points = {});

}  // namespace conveyor
