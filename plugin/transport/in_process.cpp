// In-process transport: stages are threads of one process. On an accelerator
// a message carries an event recorded on the sender's stream; the receiver's
// stream waits on it (same device) or a side stream copies the tensor across
// devices and the receiver's stream waits on the copy. No host synchronisation
// on the hot path, and the caching allocator is told which streams use which
// memory (record_stream), so nothing is freed while a copy still reads it.

#include "plugin/support/fault_injection.h"
#include "plugin/support/streams.h"
#include "plugin/transport/mailbox.h"
#include "plugin/transport/transport.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>

namespace conveyor {

namespace {

struct Message {
  Tensors tensors;
  std::shared_ptr<c10::Event> ready;  // set when a tensor is on an accelerator (one event: one stream made them)
};

bool is_accelerator(const c10::Device& device) { return device.type() != c10::DeviceType::CPU; }

void record_stream(const at::Tensor& tensor, const c10::Stream& stream) {
  if (tensor.device().is_cuda()) tensor.record_stream(stream);
}

class InProcessTransport final : public Transport {
 public:
  InProcessTransport(std::vector<c10::Device> devices, int capacity, std::chrono::milliseconds timeout)
      : devices_(std::move(devices)), timeout_(timeout) {
    const size_t k = devices_.size();
    for (size_t i = 0; i + 1 < k; ++i) {
      activations_.push_back(std::make_unique<Mailbox<Message>>(capacity));
      gradients_.push_back(std::make_unique<Mailbox<Message>>(capacity));
    }
  }

  void send(Channel channel, int from, int to, int mb, const Tensors& tensors) override {
    if (FaultInjector* faults = fault_injector()) faults->before_send(channel, from, to, mb, nullptr);
    Message message{tensors, nullptr};
    for (const auto& tensor : tensors) {
      if (tensor.defined() && is_accelerator(tensor.device())) {
        message.ready = std::make_shared<c10::Event>(tensor.device().type());
        message.ready->record(current_stream(tensor.device()));
        break;
      }
    }
    mailbox(channel, from, to).put(mb, std::move(message), deadline(), [&] {
      return c10::str("stage ", from, " timed out after ", timeout_.count(), " ms sending the ", channel_name(channel),
                      " of micro-batch ", mb, " to stage ", to, ": its channel stayed full (is stage ", to,
                      " still running?)");
    });
  }

  Tensors recv(Channel channel, int from, int to, int mb) override {
    Message message = mailbox(channel, from, to).take(mb, deadline(), [&] {
      return c10::str("stage ", to, " timed out after ", timeout_.count(), " ms waiting for the ",
                      channel_name(channel), " of micro-batch ", mb, " from stage ", from);
    });
    for (auto& tensor : message.tensors) {
      if (tensor.defined()) tensor = deliver(tensor, message.ready, devices_.at(to), to);
    }
    return std::move(message.tensors);
  }

  void barrier(int worker, int index) override {
    std::unique_lock<std::mutex> lock(barrier_mutex_);
    ++arrived_[index];
    barrier_changed_.notify_all();
    const int everyone = static_cast<int>(devices_.size());
    const bool met =
        barrier_changed_.wait_until(lock, deadline(), [&] { return aborted_ || arrived_[index] == everyone; });
    if (aborted_) throw AbortedError("aborted because another stage failed");
    if (!met) {
      throw TimeoutError(c10::str("worker ", worker, " timed out after ", timeout_.count(), " ms at lock-step barrier ",
                                  index, ": ", everyone - arrived_[index], " worker(s) never arrived"));
    }
  }

  bool copies(int from, int to) const override { return devices_.at(from) != devices_.at(to); }

  void abort() override {
    for (auto& box : activations_) box->abort();
    for (auto& box : gradients_) box->abort();
    std::lock_guard<std::mutex> lock(barrier_mutex_);
    aborted_ = true;
    barrier_changed_.notify_all();
  }

  void reset() override {
    for (auto& box : activations_) box->reset();
    for (auto& box : gradients_) box->reset();
    std::lock_guard<std::mutex> lock(barrier_mutex_);
    arrived_.clear();
    aborted_ = false;
  }

 private:
  Mailbox<Message>& mailbox(Channel channel, int from, int to) {
    const int expected_to = channel == Channel::kActivation ? from + 1 : from - 1;
    TORCH_CHECK(to == expected_to && from >= 0 && to >= 0 && std::max(from, to) < static_cast<int>(devices_.size()),
                "conveyor: no ", channel_name(channel), " channel from stage ", from, " to stage ", to);
    return channel == Channel::kActivation ? *activations_[from] : *gradients_[to];
  }

  Clock::time_point deadline() const { return Clock::now() + timeout_; }

  at::Tensor deliver(const at::Tensor& tensor, const std::shared_ptr<c10::Event>& ready, const c10::Device& dest,
                     int to) {
    if (tensor.device() == dest) {
      if (ready) {
        const c10::Stream consumer = current_stream(dest);
        ready->block(consumer);
        record_stream(tensor, consumer);
      }
      return tensor;
    }
    // Cross-device: copy on a side stream of the accelerator involved, so the
    // copy overlaps the receiver's compute on its own stream.
    const c10::Device copy_device = is_accelerator(dest) ? dest : tensor.device();
    if (!is_accelerator(copy_device)) return tensor.to(dest);
    const c10::Stream copy_stream = side_stream(to, copy_device);
    if (ready) ready->block(copy_stream);
    at::Tensor out;
    {
      c10::StreamGuard guard(copy_stream);
      out = tensor.to(dest, /*non_blocking=*/is_accelerator(dest));
    }
    record_stream(tensor, copy_stream);
    if (is_accelerator(dest)) {
      const c10::Stream consumer = current_stream(dest);
      c10::Event copied(dest.type());
      copied.record(copy_stream);
      copied.block(consumer);
      record_stream(out, consumer);
    }
    return out;
  }

  c10::Stream side_stream(int stage, const c10::Device& device) {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    const auto key = std::make_pair(stage, device.str());
    auto it = side_streams_.find(key);
    if (it == side_streams_.end()) {
      it = side_streams_.emplace(key, c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device)).first;
    }
    return it->second;
  }

  std::vector<c10::Device> devices_;
  std::chrono::milliseconds timeout_;
  std::vector<std::unique_ptr<Mailbox<Message>>> activations_;  // [k]: k -> k+1
  std::vector<std::unique_ptr<Mailbox<Message>>> gradients_;    // [k]: k+1 -> k
  std::mutex barrier_mutex_;
  std::condition_variable barrier_changed_;
  std::map<int, int> arrived_;  // barrier index -> stages that reached it
  bool aborted_ = false;
  std::mutex streams_mutex_;
  std::map<std::pair<int, std::string>, c10::Stream> side_streams_;
};

}  // namespace

std::unique_ptr<Transport> make_in_process_transport(std::vector<c10::Device> stage_devices, int capacity,
                                                     std::chrono::milliseconds timeout) {
  TORCH_CHECK(capacity >= 0, "conveyor: channel capacity must be >= 0, got ", capacity);
  return std::make_unique<InProcessTransport>(std::move(stage_devices), capacity, timeout);
}

}  // namespace conveyor
