#pragma once
// The models distributed_train trains, with their synthetic data: an MLP
// classifying features labelled by a fixed linear teacher, and the demo's
// LSTM language model (examples/common/lm_model.h, dropout 0) on token sequences
// whose targets are a fixed function of each token. Both are built from one
// seed in the order torch.nn builds them in Python, so that
// benchmarks/bench_vs_pippy.py starts torch.distributed.pipelining from the
// same weights and data.

#include "plugin/core/options.h"
#include "plugin/planner/planner.h"

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <string>

namespace conveyor::examples {

struct DistributedModel {
  std::string kind = "mlp";                  // mlp | lm
  int inputs = 256, layers = 6, classes = 10;  // mlp
  int vocab = 2000, embed = 64, length = 20;   // lm
  int hidden = 512;                          // mlp: each hidden layer; lm: each LSTM
  int batch = 256;
  int64_t seed = 1;
};

torch::nn::Sequential make_model(const DistributedModel& m);

struct Batch {
  at::Tensor x, y;
};

// The same global batch on every rank: seeded by the step.
Batch global_batch(const DistributedModel& m, int64_t step);

// Mean cross-entropy over the last dimension (classes, or the vocabulary at every position).
at::Tensor cross_entropy(const at::Tensor& out, const at::Tensor& target);

// Loss and accuracy of the whole model on a batch no step trains on, printed.
void evaluate(const DistributedModel& m, torch::nn::Sequential model);

// The planner's prediction for a pipeline of `options` across processes on
// this machine (--predict): the model profiled on its first micro-batch with
// the options' optimizer, the link between processes measured on this
// machine (measure_c10d_link: through shared memory with `shared_memory`, as
// the pipeline passes its messages by default, else over Gloo on loopback),
// the split the options give. Prints the link's measurements and the step
// predicted without its processor time.
Prediction predict_c10d_step(const DistributedModel& m, const PipelineOptions& options, bool shared_memory);

}  // namespace conveyor::examples
