#include "plugin/transport/c10d.h"

#include "plugin/errors.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>

namespace conveyor {

namespace {

using Clock = std::chrono::steady_clock;
using c10d::Work;

constexpr int64_t kMagic = 0x436f6e76;  // "Conv": a header out of step with its stream is caught at once
constexpr int64_t kMaxDims = 12;
enum HeaderField : int64_t {
  kMagicField,
  kChannel,
  kMicrobatch,
  kFrom,
  kSequence,
  kDefined,
  kDtype,
  kRoute,
  kNdim,
  kSizes
};
constexpr int64_t kHeaderLength = kSizes + kMaxDims;

// How a payload travels: none (undefined or empty tensor), through host memory
// on the main group, or on the accelerator group.
enum Route : int64_t { kNoPayload = 0, kHostRoute = 1, kDeviceRoute = 2 };

int header_tag(Channel channel, int mb) { return 4 * mb + (channel == Channel::kGradient ? 2 : 0); }

std::string shape_text(at::IntArrayRef sizes) {
  std::ostringstream os;
  os << sizes;
  return os.str();
}

}  // namespace

struct C10dTransport::State {
  struct Posted {
    c10::intrusive_ptr<Work> header, payload;
    at::Tensor header_buffer, payload_buffer;  // alive until delivered
    Channel channel;
    int mb, to;
  };

  c10::intrusive_ptr<c10d::Backend> group, device_group;
  C10dTransportOptions options;
  std::string prefix;  // "rank 3 (stage 1)"

  mutable std::mutex mutex;
  std::vector<Posted> posted;
  std::map<int, std::pair<std::vector<int64_t>, c10::ScalarType>> sent_activations;  // mb -> what went out
  std::map<Channel, int64_t> device_sent, device_received;  // ordered accelerator payloads per channel
  std::vector<c10::intrusive_ptr<Work>> waiting;            // blocking waits abort() can wake
  std::string failure;

  std::string stage_name(int stage) const {
    const int rank = stage >= 0 && stage < static_cast<int>(options.ranks.size()) ? options.ranks[stage] : -1;
    return "rank " + std::to_string(rank) + " (stage " + std::to_string(stage) + ")";
  }

  // Records the first failure and throws it; later calls rethrow it.
  [[noreturn]] void fail(const std::string& message, bool timeout = false) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (failure.empty()) failure = message;
    }
    if (timeout) throw TimeoutError(message);
    throw std::runtime_error(message);
  }

  void check_usable() {
    std::lock_guard<std::mutex> lock(mutex);
    if (!failure.empty()) {
      throw std::runtime_error(prefix + ": the transport failed earlier and cannot be used again (" + failure + ")");
    }
  }

  // Waits for `work` until `deadline`. `what` completes "waiting for ...".
  void wait(const c10::intrusive_ptr<Work>& work, Clock::time_point deadline, int peer, const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!failure.empty()) throw AbortedError(prefix + ": aborted (" + failure + ")");
      waiting.push_back(work);
    }
    const auto start = Clock::now();
    const auto remaining =
        std::max(std::chrono::milliseconds(1), std::chrono::ceil<std::chrono::milliseconds>(deadline - start));
    bool completed = false;
    std::string reason;
    try {
      completed = work->wait(remaining);
    } catch (const std::exception& e) {
      reason = message_of(e);
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      waiting.erase(std::remove(waiting.begin(), waiting.end(), work), waiting.end());
    }
    if (completed && reason.empty()) return;
    if (reason.empty()) throw AbortedError(prefix + ": aborted while waiting for " + what);
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    std::ostringstream os;
    const bool timed_out = Clock::now() + std::chrono::milliseconds(10) >= deadline;
    os << prefix << ": ";
    if (timed_out) {
      os << "timed out after " << options.timeout.count() << " ms waiting for " << what;
    } else {
      os << "lost the connection after " << waited.count() << " ms waiting for " << what << ", "
         << (peer >= 0 ? "which" : "a peer") << " has probably exited";
    }
    os << " [" << reason << "]";
    fail(os.str(), timed_out);
  }
};

C10dTransport::C10dTransport(c10::intrusive_ptr<c10d::Backend> group, c10::intrusive_ptr<c10d::Backend> device_group,
                             C10dTransportOptions options)
    : state_(std::make_unique<State>()) {
  TORCH_CHECK(group, "conveyor: C10dTransport needs a process group");
  const int k = options.stage;
  TORCH_CHECK(group->getSize() == static_cast<int>(options.ranks.size()), "conveyor: the pipeline group has ",
              group->getSize(), " ranks but ", options.ranks.size(), " stage ranks were given");
  TORCH_CHECK(group->getRank() == k, "conveyor: stage ", k, " must be rank ", k, " of its pipeline group, not ",
              group->getRank());
  TORCH_CHECK(!device_group || device_group->getSize() == group->getSize(),
              "conveyor: the accelerator group must have the pipeline group's ", group->getSize(), " ranks");
  TORCH_CHECK(options.timeout.count() > 0, "conveyor: the transport timeout must be positive");
  state_->group = std::move(group);
  state_->device_group = std::move(device_group);
  state_->options = std::move(options);
  state_->prefix = state_->stage_name(k);
}

C10dTransport::~C10dTransport() {
  // Never block here: whatever was not delivered is abandoned (a step that
  // returned normally has delivered everything already).
  try {
    abort();
  } catch (...) {
  }
}

std::string C10dTransport::describe_stage(int stage) const { return state_->stage_name(stage); }

std::string C10dTransport::failure() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->failure;
}

void C10dTransport::send(Channel channel, int from, int to, int mb, const at::Tensor& tensor) {
  State& s = *state_;
  s.check_usable();
  const int expected_to = channel == Channel::kActivation ? from + 1 : from - 1;
  TORCH_CHECK(from == s.options.stage && to == expected_to && to >= 0 && to < static_cast<int>(s.options.ranks.size()),
              "conveyor: ", s.prefix, " cannot send the ", channel_name(channel), " from stage ", from, " to stage ",
              to);
  const at::Tensor t = tensor.defined() ? tensor.detach() : tensor;
  TORCH_CHECK(!t.defined() || t.dim() <= kMaxDims, "conveyor: ", s.prefix, ": the ", channel_name(channel),
              " of micro-batch ", mb, " has ", t.dim(), " dimensions; at most ", kMaxDims, " cross stages");

  State::Posted message;
  message.channel = channel;
  message.mb = mb;
  message.to = to;
  Route route = kNoPayload;
  if (t.defined() && t.numel() > 0) {
    route = (t.device().is_cuda() && s.device_group) ? kDeviceRoute : kHostRoute;
    message.payload_buffer = route == kDeviceRoute ? t.contiguous() : t.to(c10::kCPU).contiguous();
  }
  at::Tensor header = at::zeros({kHeaderLength}, at::kLong);
  int64_t* h = header.data_ptr<int64_t>();
  h[kMagicField] = kMagic;
  h[kChannel] = static_cast<int64_t>(channel);
  h[kMicrobatch] = mb;
  h[kFrom] = from;
  h[kRoute] = route;
  h[kDefined] = t.defined() ? 1 : 0;
  if (t.defined()) {
    h[kDtype] = static_cast<int64_t>(t.scalar_type());
    h[kNdim] = t.dim();
    for (int64_t d = 0; d < t.dim(); ++d) h[kSizes + d] = t.size(d);
  }
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (route == kDeviceRoute) h[kSequence] = s.device_sent[channel]++;
    if (channel == Channel::kActivation && t.defined()) {
      s.sent_activations[mb] = {t.sizes().vec(), t.scalar_type()};
    }
  }
  message.header_buffer = header;
  const int tag = header_tag(channel, mb);
  try {
    std::vector<at::Tensor> header_list{header};
    message.header = s.group->send(header_list, to, tag);
    if (route != kNoPayload) {
      std::vector<at::Tensor> payload_list{message.payload_buffer};
      message.payload = (route == kDeviceRoute ? s.device_group : s.group)->send(payload_list, to, tag + 1);
    }
  } catch (const std::exception& e) {
    s.fail(s.prefix + ": could not send the " + channel_name(channel) + " of micro-batch " + std::to_string(mb) +
           " to " + s.stage_name(to) + " [" + message_of(e) + "]");
  }
  std::lock_guard<std::mutex> lock(s.mutex);
  s.posted.push_back(std::move(message));
}

at::Tensor C10dTransport::recv(Channel channel, int from, int to, int mb) {
  State& s = *state_;
  s.check_usable();
  const int expected_from = channel == Channel::kActivation ? to - 1 : to + 1;
  TORCH_CHECK(
      to == s.options.stage && from == expected_from && from >= 0 && from < static_cast<int>(s.options.ranks.size()),
      "conveyor: ", s.prefix, " cannot receive the ", channel_name(channel), " from stage ", from, " at stage ", to);
  const auto deadline = Clock::now() + s.options.timeout;
  const std::string what = std::string("the ") + channel_name(channel) + " of micro-batch " + std::to_string(mb) +
                           " from " + s.stage_name(from);
  const int tag = header_tag(channel, mb);
  at::Tensor header = at::empty({kHeaderLength}, at::kLong);
  c10::intrusive_ptr<Work> work;
  try {
    std::vector<at::Tensor> header_list{header};
    work = s.group->recv(header_list, from, tag);
  } catch (const std::exception& e) {
    s.fail(s.prefix + ": could not receive " + what + " [" + message_of(e) + "]");
  }
  s.wait(work, deadline, from, what);

  const int64_t* h = header.data_ptr<int64_t>();
  const auto mismatch = [&](const std::string& detail) {
    s.fail(s.prefix + ": " + what + " does not match what stage " + std::to_string(to) + " expects: " + detail);
  };
  if (h[kMagicField] != kMagic || h[kChannel] != static_cast<int64_t>(channel) || h[kMicrobatch] != mb ||
      h[kFrom] != from) {
    mismatch("its header is not a conveyor message for this channel and micro-batch (is " + s.stage_name(from) +
             " running the same schedule?)");
  }
  if (!h[kDefined]) return at::Tensor();
  const int64_t ndim = h[kNdim];
  if (ndim < 0 || ndim > kMaxDims || h[kDtype] < 0 || h[kDtype] >= static_cast<int64_t>(c10::ScalarType::NumOptions)) {
    mismatch("its header is corrupt (ndim " + std::to_string(ndim) + ", dtype code " + std::to_string(h[kDtype]) + ")");
  }
  const std::vector<int64_t> sizes(h + kSizes, h + kSizes + ndim);
  const auto dtype = static_cast<c10::ScalarType>(h[kDtype]);
  const std::string got = shape_text(sizes) + " " + c10::toString(dtype);

  if (channel == Channel::kGradient) {
    std::pair<std::vector<int64_t>, c10::ScalarType> sent;
    bool known = false;
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      const auto it = s.sent_activations.find(mb);
      if (it != s.sent_activations.end()) {
        sent = it->second;
        known = true;
        s.sent_activations.erase(it);
      }
    }
    if (known && (sent.first != sizes || sent.second != dtype)) {
      mismatch("it is " + got + ", but " + s.prefix + " sent an activation of " + shape_text(sent.first) + " " +
               c10::toString(sent.second));
    }
  } else {
    const auto& declared = s.options.activation_shapes;
    const size_t sender = static_cast<size_t>(from);
    if (sender < declared.size() && !declared[sender].empty()) {
      const auto& want = declared[sender];
      bool ok = want.size() == sizes.size();
      for (size_t d = 0; ok && d < want.size(); ++d) ok = want[d] < 0 || want[d] == sizes[d];
      if (!ok) mismatch("it is " + got + ", but the declared shape is " + shape_text(want) + " (-1: any size)");
    }
    if (s.options.activation_dtype && *s.options.activation_dtype != dtype) {
      mismatch("it is " + got + ", but the declared dtype is " + c10::toString(*s.options.activation_dtype));
    }
  }

  const auto route = static_cast<Route>(h[kRoute]);
  const auto options = at::TensorOptions().dtype(dtype);
  if (route == kNoPayload) return at::empty(sizes, options.device(s.options.device));
  if (route == kDeviceRoute) {
    if (!s.device_group) mismatch("it was sent on an accelerator group this stage does not have");
    int64_t expected = 0;
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      expected = s.device_received[channel]++;
    }
    if (h[kSequence] != expected) {
      mismatch("accelerator messages must be taken in the order they were sent (got number " +
               std::to_string(h[kSequence]) + ", expected " + std::to_string(expected) + ")");
    }
  }
  at::Tensor payload = route == kDeviceRoute ? at::empty(sizes, options.device(s.options.device))
                                             : at::empty(sizes, options.device(c10::kCPU));
  try {
    std::vector<at::Tensor> payload_list{payload};
    work = (route == kDeviceRoute ? s.device_group : s.group)->recv(payload_list, from, tag + 1);
  } catch (const std::exception& e) {
    s.fail(s.prefix + ": could not receive " + what + " [" + message_of(e) + "]");
  }
  s.wait(work, deadline, from, what);
  return payload.device() == s.options.device ? payload : payload.to(s.options.device);
}

void C10dTransport::barrier(int stage, int index) {
  State& s = *state_;
  s.check_usable();
  c10d::BarrierOptions options;
  options.timeout = s.options.timeout;
  c10::intrusive_ptr<Work> work;
  const std::string what =
      "lock-step barrier " + std::to_string(index) + " of the pipeline (stage " + std::to_string(stage) + ")";
  try {
    work = s.group->barrier(options);
  } catch (const std::exception& e) {
    s.fail(s.prefix + ": could not enter " + what + " [" + message_of(e) + "]");
  }
  s.wait(work, Clock::now() + s.options.timeout, -1, what);
}

void C10dTransport::abort() {
  State& s = *state_;
  std::vector<c10::intrusive_ptr<Work>> pending;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.failure.empty()) s.failure = s.prefix + ": the step was stopped by a failure on this rank";
    pending = s.waiting;
    for (const auto& p : s.posted) {
      pending.push_back(p.header);
      if (p.payload) pending.push_back(p.payload);
    }
    s.posted.clear();
  }
  for (const auto& work : pending) {
    try {
      if (work) work->abort();
    } catch (...) {
      // Some works cannot be aborted; the group is abandoned anyway.
    }
  }
}

void C10dTransport::finish_step() {
  State& s = *state_;
  std::vector<State::Posted> posted;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    posted.swap(s.posted);
  }
  const auto deadline = Clock::now() + s.options.timeout;
  for (const auto& p : posted) {
    const std::string what = std::string("the ") + channel_name(p.channel) + " of micro-batch " + std::to_string(p.mb) +
                             " to be taken by " + s.stage_name(p.to);
    s.wait(p.header, deadline, p.to, what);
    if (p.payload) s.wait(p.payload, deadline, p.to, what);
  }
}

void C10dTransport::reset() {
  state_->check_usable();
  finish_step();
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->sent_activations.clear();
}

}  // namespace conveyor
