#pragma once
// TorchScript models in a pipeline. A torch::jit::Module becomes a
// torch::nn::Sequential of ScriptLayers, so the Pipeline, its runtime and
// every schedule run it unchanged:
//
//   conveyor::Pipeline pipe(conveyor::load_script("lm.pt"),   // plugin/pipeline.h
//                           PipelineOptions().workers(2).microbatches(4));
//   // or, cutting where you choose:
//   conveyor::Pipeline pipe(conveyor::load_script("lm.pt"),
//                           PipelineOptions().microbatches(4).split_points({"encoder.layer2", "decoder"}));
//
// Without split points, the model's forward must be a plain chain of its
// submodules, each called once on the previous one's output:
//   def forward(self, x): return self.head(self.body(self.stem(x)))
// Each call becomes one layer (named as the submodule, "stem", "body", ...)
// and the partition policy of the options decides the stages.
//
// With split points, each names the submodule whose call begins a new stage;
// what lies between two split points may be any code (residual adds,
// branches, tensor ops), and the forward may take several tensors: every
// value made before a cut and used after it travels to the next stage (an
// encoder's output that a later decoder layer reads rides along through the
// stages between), as long as it is a tensor. A
// nested name ("encoder.layer2") cuts inside its parent's forward, which is
// inlined for that; the parent must be called once. The items of a
// ModuleList or Sequential that a forward loops over ("for layer in
// self.layers") need no inlining: TorchScript unrolls the loop, so the
// forward calls "layers.0", "layers.1", ... itself. A call of an overloaded
// forward (a scripted nn.LSTM's or nn.GRU's forward__0) is a call of that
// submodule like any other. Each stage is then one
// layer running its segment of the forward graph, and the parameters keep
// the model's names ("encoder.layer2.weight", under the layer "stage1").
//
// A layer holds the parameters and buffers of the code it runs: those of a
// submodule the forward never calls are in no layer, so not in the pipeline.

#include "plugin/model/model_names.h"
#include "plugin/script/script_layer.h"

#include <torch/csrc/jit/api/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace conveyor {

// torch::jit::load with errors a person can act on: a missing file, a file
// that is no zip archive (truncated or corrupt), and a torch.save file that
// holds no TorchScript each raise std::invalid_argument naming the path and
// the problem.
torch::jit::Module load_script(const std::string& path);

// The model as layers (see above). Throws std::invalid_argument naming what
// stands in the way: the node that breaks the chain (kind and source line),
// a split point that names no submodule, split points out of order, a
// non-tensor value live across a cut.
torch::nn::Sequential sequential_from_script(torch::jit::Module model,
                                             const std::vector<std::string>& split_points = {},
                                             ScriptLayerOptions layer_options = {});

}  // namespace conveyor
