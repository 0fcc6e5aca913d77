#pragma once
// C10dTransport: stages in separate processes (one stage per process), joined
// by PyTorch's own distributed engine. A process group whose rank r is stage r
// of one pipeline carries the messages (ProcessGroupGloo; on CUDA tensors the
// payload goes over a second group, ProcessGroupNCCL, when there is one).
//
// Wire format. A message (the tensors of one boundary, for one micro-batch)
// is a fixed-size int64 header, then one payload per tensor that has
// elements:
//
//   [magic, channel, micro-batch, from stage, count,
//    then per tensor: defined, dtype, route, sequence, bytes, ndim, size_0 .. size_{ndim-1}]
//
// An undefined tensor ("no gradient") is a record with defined = 0. Each
// message has its own block of tags (header, then one per tensor), so
// channels and micro-batches never mix, whatever order a schedule receives
// them in, and no shape needs declaring: each micro-batch may differ
// (bucketing). A message carries at most kMaxTensors tensors and as many
// dimensions as fit the header.
//
// One Gloo message per micro-batch and boundary: host payloads ride in the
// header's message when the whole fits c10d_wire::kMessageBytes (1 MiB);
// larger ones, and accelerator payloads, follow on their own tags. The
// runtime tells the transport what it will receive (expect()), and the
// receives are posted ahead, so a message lands while the stage computes.
//
// Sends never block: a message stays posted until its receiver takes it, and
// the sender keeps the tensor alive until then (it holds it anyway: the stash
// keeps every in-flight activation). finish_step() waits for every posted
// message, so a step returns only once its messages are delivered.
//
// Failures are final. A peer that dies, stalls past the timeout or sends
// something other than what this stage expects fails the transport: the error
// names this rank and stage, the peer's rank and stage, the channel and the
// micro-batch (the runtime adds the action), and every later call, reset()
// included, rethrows it. A process group that saw a failure cannot be reused:
// the job restarts (torchrun --max-restarts).

#include "plugin/core/option_list.h"
#include "plugin/transport/transport.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace c10d {
class Backend;
}

namespace conveyor {

struct C10dTransportOptions {
  // This process's worker: its rank in the pipeline group, running one stage
  // (the stage of the same index) unless place() gives it several (virtual
  // stages).
  int worker = 0;
  // Device of this worker: received tensors are placed on it.
  c10::Device device = c10::Device(c10::kCPU);
  // Global rank of every worker (process) of this pipeline, for error messages.
  std::vector<int> ranks;
  // Upper bound on every blocking wait (a receive, a barrier, flush()):
  // the pipeline's timeout option, whose default this is.
  std::chrono::milliseconds timeout = RunningOptions{}.timeout;
  // Optional declaration of what stage k sends to stage k + 1: entry k is the
  // shape of its first activation tensor, -1 for a dimension that may vary;
  // an empty entry (or a missing one) declares nothing. A received activation
  // of another shape is an error naming both stages.
  std::vector<std::vector<int64_t>> activation_shapes;
  // When set, every floating activation tensor must have this dtype.
  std::optional<c10::ScalarType> activation_dtype;
  // Messages between neighbouring workers on this machine go through shared
  // memory (plugin/transport/shared_memory.h) rather than Gloo's sockets:
  // the header and payloads up to c10d_wire::kMessageBytes; larger payloads,
  // accelerator payloads, barriers and ties stay on the groups. Making the
  // transport is then collective (every worker of the group at once).
  // Workers on other machines, or that cannot map each other's segments,
  // keep Gloo. On by default, as NCCL picks its fastest transport between
  // two ranks by itself: on one machine the rings take a fifth of the
  // processor time of Gloo's loopback a message (benchmarks/results/vs_pippy.md).
  bool shared_memory = DistributedOptions().shared_memory;  // the option's row
  // Each direction's ring (at least twice the largest message).
  int64_t shared_memory_bytes = int64_t{8} << 20;
};

class C10dTransport final : public Transport {
 public:
  // `group`: a CPU-capable group (Gloo) of the pipeline's workers, rank = worker.
  // `device_group`: optional group of the same ranks for accelerator payloads
  // (NCCL); null sends accelerator tensors through host memory on `group`.
  C10dTransport(c10::intrusive_ptr<c10d::Backend> group, c10::intrusive_ptr<c10d::Backend> device_group,
                C10dTransportOptions options);
  ~C10dTransport() override;

  static constexpr int kMaxTensors = 63;

  void send(Channel channel, int from, int to, int mb, const Tensors& tensors) override;
  Tensors recv(Channel channel, int from, int to, int mb) override;
  void expect(Channel channel, int from, int to, int mb) override;
  // Which worker runs each stage: several stages of a process (interleaved
  // schedules) pass tensors to each other directly, and each boundary has
  // its own tags. Payloads then travel through host memory on the main
  // group: NCCL matches messages by order, not tag, and the chunks of two
  // processes take their messages in different orders.
  void place(const std::vector<int>& placement) override;
  bool copies(int from, int to) const override;
  // A barrier of the pipeline group, bounded by the timeout.
  void barrier(int worker, int index) override;
  void abort() override;
  // Waits for the previous step's messages; rethrows an earlier failure.
  void reset() override;
  // Waits, at most the timeout, until every message this stage posted has
  // been received. Throws (and fails the transport) otherwise.
  void finish_step() override;
  // A barrier of the pipeline group, bounded by the timeout: a stage that
  // failed never joins it, so the others fail too and keep their weights.
  void commit() override;
  // An all-reduce of the pipeline group, bounded by the timeout.
  void reduce_over_workers(at::Tensor& values, bool max) override;
  // Tied parameters (Transport): the holders send their tensor to the first
  // holder, which adds them in stage order and sends the sum back.
  at::Tensor sum_over_holders(int tie, const std::vector<int>& holders, const at::Tensor& tensor) override;
  at::Tensor first_holders_value(int tie, const std::vector<int>& holders, const at::Tensor& tensor) override;
  // What this side has sent since it was made: messages (one per send()) and
  // the Gloo/NCCL messages they took.
  struct Counts {
    int64_t messages = 0;
    int64_t wire_messages = 0;
    int64_t shared_memory_messages = 0;  // of the wire messages, those through shared memory
  };
  // Links to neighbouring workers through shared memory (0 unless options.shared_memory).
  int shared_memory_links() const;
  Counts counts() const;

  // The first failure, empty while there has been none.
  std::string failure() const;
  bool failed() const { return !failure().empty(); }

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace conveyor
