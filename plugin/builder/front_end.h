#pragma once
// The builder's first phase (plugin/pipeline.h): the model as the
// layers a Pipeline runs, whatever it was given as.
//   - torch::nn layers (a Sequential): as they are. Split points name its
//     children ("3", or a child's own name).
//   - a TorchScript module, or the path of one saved with torch.jit.save:
//     cut by plugin/script/ (torchscript.h says what it can cut), after
//     Conveyor's fused operators are swapped in when fused_ops asks.
//   - a torch.export program, or the path of a .pt2 archive: cut by
//     plugin/export/ (exported.h).
// Split points become the stages' boundaries (each segment one stage), and
// tied_parameters, which name a TorchScript or exported model's parameters as
// the model does ("emb.weight"), are renamed as the layers name them
// ("stage0.emb.weight"). A tensor the model uses in several stages is tied
// by itself: each later stage's layer gets a copy (under another attribute,
// as after proj.weight = embed.weight, or fed to its segment, as when a later
// stage reads self.embed.weight itself), and the pipeline ties the copies.

#include "plugin/core/options.h"

#include <torch/csrc/jit/api/module.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace conveyor {

struct ExportedModel;  // plugin/export/exported.h

// What a pipeline is built from: layers, a TorchScript module, a loaded
// torch.export program, or the path of a TorchScript file or a .pt2 archive.
using Model = std::variant<torch::nn::Sequential, torch::jit::Module, std::shared_ptr<const ExportedModel>,
                           std::string>;

// The model as layers, and what the front end did on the way.
struct ModelLayers {
  torch::nn::Sequential layers;
  std::string fused_ops_report = "fused_ops is off\n";
  // The model's other names for its tied weights (alias, the name the
  // layers use), which its state_dict() has as keys too.
  std::vector<std::pair<std::string, std::string>> aliases;
  // Buffers that are no part of the model's state_dict() (non-persistent).
  std::vector<std::string> transient_buffers;
};

// That the options agree with the number of `split_points`: workers 0 or
// one per segment (of chunks_per_worker stages), no boundaries of their own.
// (Whether each names a part of the model, the front end checks.) Throws
// std::invalid_argument saying how they differ. check_request runs it.
void check_split_point_count(const PipelineOptions& options, const std::vector<std::string>& split_points);

// A model's kind, as far as the options care.
enum class ModelKind { layers, script, exported };

// `model`'s kind; none for a path, whose kind is known once it is read.
std::optional<ModelKind> model_kind(const Model& model);

// That `options` ask of a `kind` model only what it can do: fused_ops swaps
// TorchScript submodules and torch::nn layers, not a torch.export program's
// operators; optimize is the TorchScript executor's. The one statement of
// that rule, run once a pipeline: by check_request where the model's kind is
// known (the conveyor package's front end chose it before exporting), else
// by model_layers once the file is read. Throws std::invalid_argument naming
// the option.
void check_model_kind(ModelKind kind, const PipelineOptions& options);

// The model as layers (see above); sets `options`' boundaries from
// options.split_points() and renames their tied_parameters. `options` have
// passed check_request for a model of `checked_kind`; a model of another
// kind (a path's, read here) has its kind checked. Throws
// std::invalid_argument naming what stands in the way: a path that holds no
// model this build reads, a split point the model lacks, fused_ops or
// optimize for a file's model that is not TorchScript, the front end's own
// errors.
ModelLayers model_layers(const Model& model, PipelineOptions& options, std::optional<ModelKind> checked_kind);

// {1, 2, ..., n}: each of a front end's n + 1 segments one stage.
std::vector<int64_t> split_point_boundaries(const std::vector<std::string>& split_points);

// "emb.weight" in the model -> "stage0.emb.weight" among the layers (each a
// ModelPath, plugin/model/model_names.h). Throws std::invalid_argument for a name no
// layer holds.
std::string layer_parameter_name(const torch::nn::Sequential& layers, const std::string& model_name);

}  // namespace conveyor
