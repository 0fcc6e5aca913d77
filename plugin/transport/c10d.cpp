#include "plugin/transport/c10d.h"
#include "plugin/transport/c10d_state.h"

#include "plugin/core/errors.h"
#include "plugin/support/fault_injection.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

namespace conveyor {


C10dTransport::C10dTransport(c10::intrusive_ptr<c10d::Backend> group, c10::intrusive_ptr<c10d::Backend> device_group,
                             C10dTransportOptions options)
    : state_(std::make_unique<State>()) {
  TORCH_CHECK(group, "conveyor: C10dTransport needs a process group");
  const int k = options.worker;
  TORCH_CHECK(group->getSize() == static_cast<int>(options.ranks.size()), "conveyor: the pipeline group has ",
              group->getSize(), " ranks but ", options.ranks.size(), " worker ranks were given");
  TORCH_CHECK(group->getRank() == k, "conveyor: worker ", k, " must be rank ", k, " of its pipeline group, not ",
              group->getRank());
  TORCH_CHECK(!device_group || device_group->getSize() == group->getSize(),
              "conveyor: the accelerator group must have the pipeline group's ", group->getSize(), " ranks");
  TORCH_CHECK(options.timeout.count() > 0, "conveyor: the transport timeout must be positive");
  state_->group = std::move(group);
  state_->device_group = std::move(device_group);
  state_->options = std::move(options);
  for (int w = 0; w < static_cast<int>(state_->options.ranks.size()); ++w) state_->placement.push_back(w);
  state_->prefix = state_->stage_name(k);
  if (state_->options.shared_memory) {
    try {
      state_->links = std::make_unique<SharedMemoryLinks>(state_->group, state_->options.shared_memory_bytes,
                                                          state_->options.timeout);
    } catch (const std::exception& e) {
      throw std::runtime_error(c10::str("conveyor: ", state_->prefix, ": could not set up the shared-memory links [",
                                        message_of(e), "]"));
    }
  }
}

bool C10dTransport::copies(int /*from*/, int to) const { return !state_->is_local(to); }

void C10dTransport::send(Channel channel, int from, int to, int mb, const Tensors& tensors) {
  State& s = *state_;
  s.check_usable();
  const int expected_to = channel == Channel::kActivation ? from + 1 : from - 1;
  TORCH_CHECK(s.is_local(from) && to == expected_to && to >= 0 && to < s.num_stages(), "conveyor: ", s.prefix,
              " cannot send the ", channel_name(channel), " from stage ", from, " to stage ", to);
  if (s.is_local(to)) {  // two chunks of this process: the tensors as they are
    std::lock_guard<std::mutex> lock(s.mutex);
    s.local_messages[{channel, to, mb}] = tensors;
    return;
  }
  State::Posted message;
  message.what = c10::str("the ", channel_name(channel), " of micro-batch ", mb);
  message.to = to;
  TORCH_CHECK(tensors.size() <= static_cast<size_t>(kMaxTensors), "conveyor: ", s.prefix, ": ", message.what, " has ",
              tensors.size(), " tensors; at most ", kMaxTensors, " cross a stage boundary");

  // Each tensor's route; the host payloads ride inline if the message fits a receiver's buffer.
  std::vector<Route> routes(tensors.size(), kNoPayload);
  int64_t length = kHeaderBytes;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (!t.defined() || t.numel() == 0) continue;
    routes[i] = (t.device().is_cuda() && s.device_group) ? kDeviceRoute : kHostRoute;
    if (routes[i] == kHostRoute) length += aligned_payload(t.numel() * static_cast<int64_t>(t.element_size()));
  }
  const bool inline_host = length <= kMessageBytes;
  at::Tensor first = at::empty({inline_host ? length : kHeaderBytes}, at::kByte);
  char* base = static_cast<char*>(first.data_ptr());
  std::memset(base, 0, kHeaderBytes);
  int64_t* h = reinterpret_cast<int64_t*>(base);
  h[kMagicField] = kMagic;
  h[kChannel] = static_cast<int64_t>(channel);
  h[kMicrobatch] = mb;
  h[kFrom] = from;
  h[kCount] = static_cast<int64_t>(tensors.size());
  std::vector<Sent> sent(tensors.size());
  std::vector<int64_t> records;
  std::vector<std::pair<Route, at::Tensor>> payloads;  // one per tensor; those not inline have tags of their own
  int64_t at = kPreambleLength, offset = kHeaderBytes;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor t = tensors[i].defined() ? tensors[i].detach() : tensors[i];
    const int64_t ndim = t.defined() ? t.dim() : 0;
    TORCH_CHECK(at + kSizes + ndim <= kHeaderLength, "conveyor: ", s.prefix, ": ", message.what, " has ",
                tensors.size(), " tensors with too many dimensions in all to describe in one message (",
                kHeaderLength - kPreambleLength, " values: ", kSizes, " per tensor plus one per dimension)");
    int64_t* r = h + at;
    records.push_back(at);
    at += kSizes + ndim;
    const Route route = routes[i] == kHostRoute && inline_host ? kInlineRoute : routes[i];
    r[kDefined] = t.defined() ? 1 : 0;
    if (t.defined()) {
      r[kDtype] = static_cast<int64_t>(t.scalar_type());
      r[kNdim] = ndim;
      for (int64_t d = 0; d < ndim; ++d) r[kSizes + d] = t.size(d);
      sent[i] = {true, t.sizes().vec(), t.scalar_type()};
    }
    r[kRoute] = route;
    const int64_t bytes = route == kNoPayload ? 0 : t.numel() * static_cast<int64_t>(t.element_size());
    r[kBytes] = bytes;
    at::Tensor payload;
    if (route == kInlineRoute) {
      const at::Tensor host = t.to(c10::kCPU).contiguous();
      std::memcpy(base + offset, host.const_data_ptr(), static_cast<size_t>(bytes));
      offset += aligned_payload(bytes);
    } else if (route != kNoPayload) {
      payload = route == kDeviceRoute ? t.contiguous() : t.to(c10::kCPU).contiguous();
    }
    payloads.emplace_back(route, std::move(payload));
  }
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    for (size_t i = 0; i < payloads.size(); ++i) {
      if (payloads[i].first == kDeviceRoute) h[records[i] + kSequence] = s.device_sent[channel]++;
    }
    if (channel == Channel::kActivation) s.sent_activations[{from, mb}] = std::move(sent);
  }
  FaultInjector* faults = fault_injector();
  if (faults) faults->before_send(channel, from, to, mb, h);
  const int tag = s.tag(channel, from, mb), peer = s.worker_of(to);
  const bool shared = s.links && s.links->sends_to(peer);
  try {
    std::vector<at::Tensor> list{first};
    if (shared) {  // copied into the ring: delivered, nothing to wait for
      s.links->send(peer, tag, base, first.numel(), Clock::now() + s.options.timeout);
    } else {
      message.works.push_back(s.group->send(list, peer, tag));
      message.buffers.push_back(first);
    }
    if (faults) {
      faults->after_header(channel, from, to, mb, [&] {
        if (!shared) s.wait(message.works.front(), Clock::now() + s.options.timeout, to, message.what + " to be taken");
      });
    }
    for (size_t i = 0; i < payloads.size(); ++i) {
      const auto& [route, payload] = payloads[i];
      if (route == kNoPayload || route == kInlineRoute) continue;
      list = {payload};
      message.works.push_back((route == kDeviceRoute ? s.device_group : s.group)->send(list, peer, tag + 1 + int(i)));
      message.buffers.push_back(payload);
    }
  } catch (const std::exception& e) {
    s.fail(s.prefix + ": could not send " + message.what + " to " + s.stage_name(to) + " [" + message_of(e) + "]");
  }
  std::lock_guard<std::mutex> lock(s.mutex);
  ++s.counts.messages;
  s.counts.wire_messages += static_cast<int64_t>(message.works.size()) + (shared ? 1 : 0);
  s.counts.shared_memory_messages += shared ? 1 : 0;
  s.posted.push_back(std::move(message));
}

Tensors C10dTransport::recv(Channel channel, int from, int to, int mb) {
  State& s = *state_;
  s.check_usable();
  const int expected_from = channel == Channel::kActivation ? to - 1 : to + 1;
  TORCH_CHECK(s.is_local(to) && from == expected_from && from >= 0 && from < s.num_stages(), "conveyor: ", s.prefix,
              " cannot receive the ", channel_name(channel), " from stage ", from, " at stage ", to);
  if (s.is_local(from)) {  // run by this thread, so sent already if the schedule is valid
    std::lock_guard<std::mutex> lock(s.mutex);
    const auto it = s.local_messages.find({channel, to, mb});
    TORCH_CHECK(it != s.local_messages.end(), "conveyor: ", s.prefix, ": stage ", to, " needs the ",
                channel_name(channel), " of micro-batch ", mb, " from stage ", from,
                ", which this process has not computed yet (the schedule orders them the other way)");
    Tensors tensors = std::move(it->second);
    s.local_messages.erase(it);
    return tensors;
  }
  const auto deadline = Clock::now() + s.options.timeout;
  const std::string what =
      c10::str("the ", channel_name(channel), " of micro-batch ", mb, " from ", s.stage_name(from));
  const int tag = s.tag(channel, from, mb), peer = s.worker_of(from);
  // The message's first part: in a buffer posted ahead, or posted now.
  State::Ahead first;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (const auto it = s.ahead.find({channel, mb}); it != s.ahead.end()) {
      first = std::move(it->second);
      s.ahead.erase(it);
    }
  }
  try {
    if (!first.work) first = s.post_receive(channel, from, mb);
  } catch (const std::exception& e) {
    s.fail(c10::str(s.prefix, ": could not receive ", what, " [", message_of(e), "]"));
  }
  s.wait(first.work, deadline, from, what);
  const char* base = static_cast<const char*>(first.buffer.const_data_ptr());
  const int64_t* h = reinterpret_cast<const int64_t*>(base);
  const auto mismatch = [&](const std::string& detail) {
    s.fail(c10::str(s.prefix, ": ", what, " does not match what stage ", to, " expects: ", detail));
  };
  std::vector<Incoming> incoming;
  try {
    incoming = decode_header(h, channel, mb, from, kMaxTensors);
  } catch (const std::invalid_argument& e) {
    mismatch(c10::str(e.what(), " (is ", s.stage_name(from), " running the same schedule?)"));
  }
  const auto text = [](const Sent& t) {
    return t.defined ? shape_text(t.sizes) + " " + c10::toString(t.dtype) : std::string("nothing");
  };

  if (channel == Channel::kGradient) {
    std::vector<Sent> sent;
    bool known = false;
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      const auto it = s.sent_activations.find({to, mb});
      if (it != s.sent_activations.end()) {
        sent = std::move(it->second);
        known = true;
        s.sent_activations.erase(it);
      }
    }
    if (known && sent.size() != incoming.size()) {
      mismatch(c10::str("it has ", incoming.size(), " tensors, but ", s.prefix, " sent ", sent.size()));
    }
    for (size_t i = 0; known && i < incoming.size(); ++i) {
      const Sent& got = incoming[i].shape;
      if (got.defined && (!sent[i].defined || sent[i].sizes != got.sizes || sent[i].dtype != got.dtype)) {
        mismatch(c10::str("its tensor ", i, " is ", text(got), ", but ", s.prefix, " sent an activation of ",
                          text(sent[i])));
      }
    }
  } else if (!incoming.empty() && incoming[0].shape.defined) {
    const auto& declared = s.options.activation_shapes;
    const size_t sender = static_cast<size_t>(from);
    const Sent& first = incoming[0].shape;
    if (sender < declared.size() && !declared[sender].empty()) {
      const auto& want = declared[sender];
      bool ok = want.size() == first.sizes.size();
      for (size_t d = 0; ok && d < want.size(); ++d) ok = want[d] < 0 || want[d] == first.sizes[d];
      if (!ok) mismatch("it is " + text(first) + ", but the declared shape is " + shape_text(want) + " (-1: any size)");
    }
  }
  if (channel == Channel::kActivation && s.options.activation_dtype) {
    for (const auto& in : incoming) {
      if (in.shape.defined && c10::isFloatingType(in.shape.dtype) && in.shape.dtype != *s.options.activation_dtype) {
        mismatch("it holds " + text(in.shape) + ", but the declared dtype is " +
                 c10::toString(*s.options.activation_dtype));
      }
    }
  }

  // Post every payload's receive, then wait for them all.
  Tensors tensors(incoming.size());
  std::vector<std::pair<c10::intrusive_ptr<Work>, size_t>> pending;
  for (size_t i = 0; i < incoming.size(); ++i) {
    const Incoming& in = incoming[i];
    if (!in.shape.defined) continue;
    const auto options = at::TensorOptions().dtype(in.shape.dtype);
    if (in.route == kNoPayload) {
      tensors[i] = at::empty(in.shape.sizes, options.device(s.options.device));
      continue;
    }
    if (in.route == kInlineRoute) {
      tensors[i] = at::empty(in.shape.sizes, options.device(c10::kCPU));
      std::memcpy(tensors[i].mutable_data_ptr(), base + in.offset, static_cast<size_t>(in.bytes));
      if (tensors[i].device() != s.options.device) tensors[i] = tensors[i].to(s.options.device);
      continue;
    }
    if (in.route == kDeviceRoute) {
      if (!s.device_group) mismatch("it was sent on an accelerator group this stage does not have");
      int64_t expected = 0;
      {
        std::lock_guard<std::mutex> lock(s.mutex);
        expected = s.device_received[channel]++;
      }
      if (in.sequence != expected) {
        mismatch(c10::str("accelerator messages must be taken in the order they were sent (got number ", in.sequence,
                          ", expected ", expected, ")"));
      }
    }
    tensors[i] = at::empty(in.shape.sizes,
                           options.device(in.route == kDeviceRoute ? s.options.device : c10::Device(c10::kCPU)));
    try {
      std::vector<at::Tensor> list{tensors[i]};
      pending.emplace_back((in.route == kDeviceRoute ? s.device_group : s.group)->recv(list, peer, tag + 1 + int(i)),
                           i);
    } catch (const std::exception& e) {
      s.fail(c10::str(s.prefix, ": could not receive ", what, " [", message_of(e), "]"));
    }
  }
  s.give_buffer(std::move(first.buffer));
  s.post_ahead(channel);
  for (const auto& [payload, i] : pending) {
    s.wait(payload, deadline, from, what);
    if (tensors[i].device() != s.options.device) tensors[i] = tensors[i].to(s.options.device);
  }
  return tensors;
}

}  // namespace conveyor
