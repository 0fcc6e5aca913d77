#pragma once
// ActivationStash: what a stage keeps for its in-flight micro-batches between
// a forward and its backward, within one step, and the peaks a StepResult
// reports. What goes into an entry is the schedule's declaration
// (schedules::Stash): the forward's graph, or only its input (the backward
// replays the forward, as features replay does), possibly waiting in host
// memory (offloaded). A split backward keeps the entry from its I to its W.

#include "plugin/model/stage.h"
#include "plugin/model/stage_random.h"
#include "plugin/support/tensors.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>
#include <torch/csrc/autograd/edge.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

namespace conveyor {

struct StashEntry {
  // The stage's inputs, a slot each: the grad-requiring leaves of the graph
  // (other slots undefined), or, when only inputs are kept, the plain inputs
  // the backward replays the forward from.
  Tensors inputs;
  // What the backward differentiates: the stage's outputs that require grad
  // (other slots undefined), or the scaled loss on the last stage. Empty when
  // only the inputs are kept.
  Tensors roots;
  // Per slot of `roots`: where the backward enters the graph of an output
  // released once sent (Runtime options' free_sent_activations; that slot of
  // `roots` undefined), else empty.
  std::vector<torch::autograd::Edge> released_roots;
  bool inputs_only = false;
  std::shared_ptr<WeightVersion> weights;    // the version the forward read (weight stashing)
  std::optional<StageRandom::State> random;  // where the stage's streams stood (a replay with stage_rng)
  int64_t bytes = 0;                         // the input and output tensors held for this micro-batch

  // --- split backwards (I then W) ---
  // Every layer's outputs (Stage::forward), and after the I their gradients,
  // from which the W computes each layer's weight gradients.
  std::vector<Tensors> layer_outputs;
  std::vector<Tensors> layer_grads;
  bool input_backward_done = false;

  // --- offloading (schedules::Stash::kOffload, on an accelerator) ---
  // `inputs` are in pinned host memory; a prefetch copies them back on the
  // stage's side stream into `prefetched`, complete once `prefetched_ready` is.
  bool offloaded = false;
  Tensors prefetched;
  std::optional<c10::Event> prefetched_ready;
};

class ActivationStash {
 public:
  void put(int mb, StashEntry entry);
  // Takes micro-batch mb's entry out; throws when its forward stashed none.
  StashEntry take(int mb);
  // Micro-batch mb's entry, left in place (an I, a prefetch); throws when
  // there is none. `find` returns null instead.
  StashEntry& at(int mb);
  StashEntry* find(int mb);

  int peak_inflight() const { return peak_inflight_; }
  int peak_activations() const { return peak_activations_; }
  int peak_inputs() const { return peak_inputs_; }
  int64_t peak_bytes() const { return peak_bytes_; }

 private:
  std::map<int, StashEntry> entries_;
  int activations_ = 0, inputs_ = 0;
  int64_t bytes_ = 0;
  int peak_inflight_ = 0, peak_activations_ = 0, peak_inputs_ = 0;
  int64_t peak_bytes_ = 0;
};

}  // namespace conveyor
