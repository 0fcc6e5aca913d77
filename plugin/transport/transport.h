#pragma once
// Transport: how a stage hands the activations (forward) or gradients
// (backward) of one micro-batch to its neighbour: a list of tensors, one per
// slot of the boundary (Tensors, ops/adapters.h), shapes free to differ from
// one micro-batch to the next. The runtime calls send/recv
// and barrier inside a step, reset() before it and finish_step() after it;
// in_process.cpp holds the threads' transport (device copies on side
// streams), c10d.h the processes' one.

#include "ops/adapters.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace conveyor {

enum class Channel {
  kActivation,  // stage k -> k+1, produced by a forward
  kGradient,    // stage k+1 -> k, produced by a backward
};

const char* channel_name(Channel channel);  // "activation" / "gradient"

class Transport {
 public:
  virtual ~Transport() = default;

  // Hands micro-batch `mb`'s tensors from stage `from` to stage `to`. Blocks
  // while that channel holds `capacity` undelivered messages, at most until the
  // timeout. An undefined tensor is a valid slot ("no gradient").
  virtual void send(Channel channel, int from, int to, int mb, const Tensors& tensors) = 0;

  // Blocks until micro-batch `mb`'s message from `from` arrives, at most until
  // the timeout. The tensors are on stage `to`'s device, and work queued on the
  // receiver's current stream after this call sees them complete.
  virtual Tensors recv(Channel channel, int from, int to, int mb) = 0;

  // Says, before a step's first action, that this side will call
  // recv(channel, from, to, mb) during the step, in the order of these calls:
  // a transport may post the receive ahead. Only a hint; reset() forgets it.
  virtual void expect(Channel /*channel*/, int /*from*/, int /*to*/, int /*mb*/) {}

  // Which worker runs each stage (the schedule's placement), before the
  // first step. In-process every worker is a thread of this process.
  virtual void place(const std::vector<int>& /*placement*/) {}

  // A lock-step barrier of worker `worker`: returns once every worker has
  // called barrier(_, index), at most until the timeout.
  virtual void barrier(int worker, int index) = 0;

  // Whether stage `to` receives its own copy of what stage `from` sends
  // (another process, another device): the sender's tensors are then its
  // own once sent, and it may release their data.
  virtual bool copies(int /*from*/, int /*to*/) const { return false; }

  // Wakes every blocked send/recv/barrier with AbortedError (another stage failed).
  virtual void abort() = 0;

  // Drops undelivered messages and clears abort(), before a new step.
  virtual void reset() = 0;

  // Ends a step that succeeded on this side: returns once what this side sent
  // has been delivered, at most until the timeout, and throws otherwise. The
  // runtime calls it after its stages' last actions and before any optimizer
  // step, so a step whose messages did not arrive changes no weights.
  // In-process there is nothing to wait for.
  virtual void finish_step() {}

  // Ends a training step that succeeded on this side, after finish_step():
  // returns once every side's step got this far, at most until the timeout,
  // and throws otherwise. A message delivered is not a message accepted (its
  // receiver may refuse it, or fail after it): no side changes its weights
  // until all have come through. In-process the runtime sees every stage.
  virtual void commit() {}

  // Tied parameters held by stages of other processes. `holders` are the
  // stages that hold one logical parameter, ascending; `tie` numbers it among
  // the pipeline's ties; this process's stage is one of the holders.
  // sum_over_holders returns the sum of every holder's `tensor` (a gradient),
  // the same bits on every holder; first_holders_value returns the first
  // holder's `tensor` (the initial value). In-process every holder is local
  // and the runtime needs neither: the defaults refuse.
  // A small CPU tensor reduced element-wise over every worker of the
  // pipeline, in place: summed, or the largest value taken (`max`). The
  // update's verdicts (an inf anywhere) and its global gradient norm use it.
  // In-process every worker is local and the runtime has reduced already:
  // the default leaves `values` as they are.
  virtual void reduce_over_workers(at::Tensor& /*values*/, bool /*max*/) {}

  virtual at::Tensor sum_over_holders(int tie, const std::vector<int>& holders, const at::Tensor& tensor);
  virtual at::Tensor first_holders_value(int tie, const std::vector<int>& holders, const at::Tensor& tensor);
};

// Threads of one process; stage k's tensors live on stage_devices[k].
std::unique_ptr<Transport> make_in_process_transport(std::vector<c10::Device> stage_devices, int capacity,
                                                     std::chrono::milliseconds timeout);

}  // namespace conveyor
