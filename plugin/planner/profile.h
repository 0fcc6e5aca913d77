#pragma once
// The profiler: what each layer of a model costs, measured on the device it
// will run on, so a partition can balance time rather than layer counts and a
// simulator can predict a step. Per layer: forward and backward time (median
// of repeats after warm-up, at two batch sizes so that the part that does not
// grow with the batch is known), output bytes, trainable weight bytes; for
// the model: its inputs' bytes, the loss's time, and the link between stages.
//
//   auto profile = conveyor::profile_model(model, {microbatch_input}, {microbatch_target}, loss_fn);
//   (profile_model, plugin/measure/profile_model.h: these layers' costs and the runtime's own)
//   std::cout << profile.str();
//   conveyor::PipelineOptions().balance(conveyor::Balance::kTime).profile(
//       std::make_shared<conveyor::ModelProfile>(profile));

#include "plugin/core/options.h"
#include "plugin/core/types.h"

#include <c10/core/Device.h>
#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <string>
#include <vector>

namespace conveyor {

struct LayerProfile {
  std::string name;  // "2 conveyor::FirstOutput<torch::nn::LSTM(...)>"
  // At ModelProfile::batch_size samples, and the part of each that does not
  // scale with the batch (launches, per-call work; 0 when measured at one size).
  double forward_seconds = 0, backward_seconds = 0;
  double forward_fixed = 0, backward_fixed = 0;
  int64_t output_bytes = 0;       // every output tensor, at batch_size samples
  int64_t output_grad_bytes = 0;  // the floating outputs, which get a gradient back
  int64_t parameter_bytes = 0;    // trainable weights (a gradient and optimizer state each)
  // One step of ProfileOptions::optimizer over the layer's weights (0: not measured).
  double update_seconds = 0;
  // The runtime's bookkeeping around updates, over the layer's weights: the
  // divergence guard's check of their gradients (once a step, or after every
  // backward of an asynchronous schedule), and a copy of them (a stashed
  // weight version after every update under weight stashing; an
  // asynchronous step's rollback point).
  double check_seconds = 0, copy_seconds = 0;
  // The backward split as zero-bubble schedules run it (plugin/runtime/
  // split_backward.cpp), at batch_size samples: I, the gradients of the
  // layer's inputs (graph retained), then W, its weights' gradients from its
  // outputs' (0 without weights). Both 0: not measured (half the backward
  // each). For a layer of many operations I + W exceeds the backward, since
  // W walks the layer's graph again.
  double input_backward_seconds = 0, weight_backward_seconds = 0;
};

// The cost of moving a micro-batch's tensors from one stage to the next:
// latency + bytes / bandwidth.
struct LinkProfile {
  std::string kind;               // "in-process handoff (same device)", "cpu -> cuda:1 copy"
  double latency_seconds = 0;
  double bytes_per_second = 0;    // 0: the bytes cost nothing (nothing is copied)
  // The processor time a transfer costs the two processes together (the
  // sender's and the receiver's c10d work, Gloo's I/O threads included), not
  // counting waits: time taken from the compute when the workers keep every
  // core busy, as the link's latency (measured between idle ranks) is not.
  // 0: not measured, or nothing to pay (the in-process handoff).
  double cpu_seconds_per_transfer = 0;
  double cpu_seconds_per_byte = 0;  // and per byte of payload
  double seconds(int64_t bytes) const;
  double cpu_seconds(int64_t bytes) const;
};

struct ModelProfile {
  std::string device;
  int64_t batch_size = 0;         // samples per profiled micro-batch (along batch_dim)
  int64_t input_bytes = 0;        // the model's inputs at batch_size samples
  double loss_forward_seconds = 0, loss_backward_seconds = 0;
  // The runtime's own time per action (receive, stash, send, waking the next
  // stage's thread), measured on a pipeline of layers that do nothing.
  double action_overhead_seconds = 0;
  std::vector<LayerProfile> layers;
  LinkProfile link;
  // On an accelerator: a copy from the device to host memory (the way an
  // offloaded stash moves, out after a forward and back before its backward;
  // PipelineOptions::offload). Empty kind: not measured (on a CPU nothing moves).
  LinkProfile host_link;
  // On a CPU: how many workers can compute at once, its hardware threads
  // (each worker on one intra-op thread, as the examples run them); set with
  // ProfileOptions::count_cores. A plan whose workers all run on this CPU and
  // outnumber them makes them wait for a core (StageCosts::cores). 0: not
  // counted, or an accelerator (a device per worker).
  int cores = 0;
  // Measured with `cores`: slowdown[n - 1] is how much longer the model's
  // work takes on each of n threads running it at once than alone, n = 1 ..
  // cores + 2 (StageCosts::slowdown). Plans of workers on this CPU are priced
  // as sharing it: an action runs slower while others run, at full speed
  // while the other workers wait. Empty: not measured (then `cores` alone
  // makes workers beyond the cores wait their turn).
  std::vector<double> slowdown;
  // Measured with `slowdown` by profile_model: the runtime's time per action
  // when a CPU's workers outnumber its cores (a worker woken for its next
  // action may wait for one), in place of action_overhead_seconds for such
  // plans. 0: not measured.
  double crowded_action_overhead_seconds = 0;

  // Times and bytes scaled to a micro-batch of n samples.
  double forward_seconds(size_t layer, double n) const;
  double backward_seconds(size_t layer, double n) const;
  // The split backward's I and W, scaled as the backward; 0 and 0 when the
  // layer's split was not measured.
  double input_backward_seconds(size_t layer, double n) const;
  double weight_backward_seconds(size_t layer, double n) const;
  double loss_seconds(double n) const;  // forward and backward of the loss
  // A table: one line per layer.
  std::string str() const;
};

struct ProfileOptions {
  // Where to measure: the device the stages will run on ("cpu", "cuda:0").
  TORCH_ARG(std::string, device) = "cpu";
  TORCH_ARG(int, warmup) = 2;
  TORCH_ARG(int, repeats) = 5;
  // Also measure at half the batch, to separate fixed from per-sample cost.
  TORCH_ARG(bool, two_sizes) = true;
  // The dimension inputs and targets are batched along (PipelineOptions::batch_dim).
  TORCH_ARG(int64_t, batch_dim) = 0;
  // How many stages will share this device (threads on one CPU): each layer
  // is measured while as many other threads run its forward, as the other
  // stages will while this one works, so contention is in the profile.
  TORCH_ARG(int, sharing_stages) = 1;
  // profile_model: measure the runtime's cost per action (ModelProfile::action_overhead_seconds).
  TORCH_ARG(bool, action_overhead) = true;
  // Measure the link between these two devices too (empty: the same device,
  // the in-process handoff).
  TORCH_ARG(std::string, next_device) = "";
  // Time one step of this optimizer (PipelineOptions::optimizer) over each
  // layer's weights (LayerProfile::update_seconds), on copies: what an
  // asynchronous schedule pays after every backward, and a pipeline that
  // steps its own optimizer once a step (plugin/planner/planner.h).
  TORCH_ARG(OptimizerFactory, optimizer) = nullptr;
  // Record the CPU's cores (ModelProfile::cores) and measure how workers
  // computing at once slow each other (ModelProfile::slowdown: the model's
  // forward and backward on 1 .. cores + 2 threads at once), so that plans
  // whose workers share this CPU are priced as sharing it.
  TORCH_ARG(bool, count_cores) = false;
};

}  // namespace conveyor
