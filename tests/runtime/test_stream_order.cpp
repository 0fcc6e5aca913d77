// The order between the caller's stream and the workers' streams, seen on a
// CPU machine: the workers are mapped onto a fake accelerator whose guard
// (a DeviceGuardImplInterface, in the manner of c10's FakeGuardImpl) records
// every stream, event and wait call, and work is noted on the stream it would
// run on: each action (from the fault injector's hook, on the worker's
// thread), the caller's own optimizer step between steps, and the pipeline's
// optimizer. From those records the test derives happens-before as a GPU
// would (program order on a stream, an event's record before its waits, a
// host synchronize before what the host queues next) and asserts, for every
// schedule, both optimizer ownerships, several workers on one device and
// workers on two devices: what the caller queued before a step comes before
// every action of the step, and every action of a step comes before what the
// caller queues after it. Without the fences of plugin/runtime/stream_order.h
// neither holds.
#include "plugin/runtime/stream_order.h"
#include "plugin/support/fault_injection.h"
#include "schedules/generators.h"
#include "test_models.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <deque>
#include <map>
#include <mutex>

namespace conveyor {
namespace {

constexpr c10::DeviceType kFakeType = c10::DeviceType::PrivateUse1;

// A queue of work on the fake accelerator: (device index, stream id).
using StreamKey = std::pair<int, c10::StreamId>;

struct Entry {
  enum Kind { kWork, kRecord, kWait, kSync } kind;
  StreamKey stream;
  int64_t event = 0, version = 0;  // kRecord, kWait
  std::string label;               // kWork
};

class RecordingGuard final : public c10::impl::DeviceGuardImplInterface {
 public:
  c10::DeviceType type() const override { return kFakeType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device old = getDevice();
    device_index() = d.index();
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kFakeType, device_index()); }
  void setDevice(c10::Device d) const override { device_index() = d.index(); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { device_index() = d.index(); }
  c10::Stream getStream(c10::Device d) const override {
    auto& current = current_streams();
    const auto it = current.find(d.index());
    return stream(d.index(), it == current.end() ? 0 : it->second);
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return stream(d.index(), 0); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool = false) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stream(d.index(), ++next_stream_);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    const c10::Stream old = getStream(s.device());
    current_streams()[s.device_index()] = s.id();
    active() = s.id() == 0 ? std::nullopt : std::optional<c10::Stream>(s);
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return 0; }  // nothing spawns threads for it
  void record(void** event, const c10::Stream& s, const c10::DeviceIndex, const c10::EventFlag) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (*event == nullptr) *event = reinterpret_cast<void*>(++next_event_);
    const auto id = reinterpret_cast<int64_t>(*event);
    log_.push_back({Entry::kRecord, key(s), id, ++versions_[id], ""});
  }
  void block(void* event, const c10::Stream& s) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto id = reinterpret_cast<int64_t>(event);
    log_.push_back({Entry::kWait, key(s), id, versions_[id], ""});
  }
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream& s) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    log_.push_back({Entry::kSync, key(s), 0, 0, ""});
  }
  void synchronizeEvent(void*) const override {}
  double elapsedTime(void*, void*, const c10::DeviceIndex) const override { return 0; }

  // Notes work on the calling thread's active worker stream, or, on a thread
  // with none (the caller's), on its current stream of each of `devices`.
  // Returns the entries' indices.
  std::vector<size_t> work(const std::string& label, const std::vector<int>& devices) const {
    std::vector<StreamKey> on;
    if (active()) {
      on.push_back(key(*active()));
    } else {
      for (int d : devices) on.push_back(key(getStream(c10::Device(kFakeType, static_cast<c10::DeviceIndex>(d)))));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<size_t> at;
    for (const StreamKey& s : on) {
      at.push_back(log_.size());
      log_.push_back({Entry::kWork, s, 0, 0, label});
    }
    return at;
  }
  std::deque<Entry> log() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return log_;
  }

  // Whether entry `a` happens before entry `b`: program order on a stream,
  // an event's record before the waits for that record, and a host
  // synchronize of a stream before everything queued after it.
  static bool happens_before(const std::deque<Entry>& log, size_t a, size_t b) {
    std::vector<bool> seen(log.size());
    std::vector<size_t> todo{a};
    seen[a] = true;
    while (!todo.empty()) {
      const size_t i = todo.back();
      todo.pop_back();
      if (i == b) return true;
      for (size_t j = i + 1; j < log.size(); ++j) {
        const bool edge = log[j].stream == log[i].stream || log[i].kind == Entry::kSync ||
                          (log[i].kind == Entry::kRecord && log[j].kind == Entry::kWait &&
                           log[j].event == log[i].event && log[j].version == log[i].version);
        if (edge && !seen[j]) {
          seen[j] = true;
          todo.push_back(j);
        }
      }
    }
    return false;
  }

 private:
  static c10::Stream stream(c10::DeviceIndex index, c10::StreamId id) {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kFakeType, index), id);
  }
  static StreamKey key(const c10::Stream& s) { return {s.device_index(), s.id()}; }
  static c10::DeviceIndex& device_index() {
    thread_local c10::DeviceIndex index = 0;
    return index;
  }
  static std::map<c10::DeviceIndex, c10::StreamId>& current_streams() {
    thread_local std::map<c10::DeviceIndex, c10::StreamId> current;
    return current;
  }
  static std::optional<c10::Stream>& active() {
    thread_local std::optional<c10::Stream> stream;
    return stream;
  }
  mutable std::mutex mutex_;
  mutable c10::StreamId next_stream_ = 0;
  mutable int64_t next_event_ = 0;
  mutable std::map<int64_t, int64_t> versions_;
  mutable std::deque<Entry> log_;
};

// Notes each action as work on the worker's stream.
class ActionNotes final : public FaultInjector {
 public:
  explicit ActionNotes(const RecordingGuard& guard) : guard_(guard) {}
  void before_action(int stage, const schedules::Action& action) override {
    const std::vector<size_t> at = guard_.work(action.str(), {});
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i : at) actions.emplace_back(i, stage);
  }
  std::vector<std::pair<size_t, int>> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(actions, {});
  }

 private:
  const RecordingGuard& guard_;
  std::mutex mutex_;
  std::vector<std::pair<size_t, int>> actions;  // (log entry, stage)
};

// The fake guard registered for the test's length, the workers mapped onto
// it, and the action notes installed.
class FakeAccelerator {
 public:
  explicit FakeAccelerator(int devices)
      : previous_(c10::impl::device_guard_impl_registry[static_cast<size_t>(kFakeType)].load()),
        notes_(guard_),
        scope_(notes_) {
    c10::impl::device_guard_impl_registry[static_cast<size_t>(kFakeType)].store(&guard_);
    testing::set_stream_devices(
        [devices](int worker) { return c10::Device(kFakeType, static_cast<c10::DeviceIndex>(worker % devices)); });
  }
  ~FakeAccelerator() {
    testing::set_stream_devices(nullptr);
    c10::impl::device_guard_impl_registry[static_cast<size_t>(kFakeType)].store(previous_);
  }
  RecordingGuard& guard() { return guard_; }
  ActionNotes& notes() { return notes_; }

 private:
  RecordingGuard guard_;
  const c10::impl::DeviceGuardImplInterface* previous_;
  ActionNotes notes_;
  FaultInjectionScope scope_;
};

// SGD whose step is noted as work where it runs.
class NotedSgd final : public torch::optim::SGD {
 public:
  NotedSgd(std::vector<at::Tensor> params, const RecordingGuard& guard, std::vector<int> devices)
      : torch::optim::SGD(std::move(params), torch::optim::SGDOptions(0.01)), guard_(guard), devices_(devices) {}
  at::Tensor step(LossClosure closure = nullptr) override {
    guard_.work("pipeline optimizer", devices_);
    return torch::optim::SGD::step(std::move(closure));
  }

 private:
  const RecordingGuard& guard_;
  std::vector<int> devices_;
};

struct OrderCase {
  std::string schedule;
  int workers, devices;
  bool pipeline_optimizer;
  std::string name() const {
    return schedule + " workers=" + std::to_string(workers) + " devices=" + std::to_string(devices) +
           (pipeline_optimizer ? " pipeline's optimizer" : " caller's optimizer");
  }
};

// Every action noted since the last call happens after `before` and before `after`.
void expect_fenced(const RecordingGuard& guard, const std::vector<std::pair<size_t, int>>& actions,
                   const std::vector<size_t>& before, const std::vector<size_t>& after, const std::string& where) {
  ASSERT_FALSE(actions.empty()) << where << ": no action was noted";
  const std::deque<Entry> log = guard.log();
  for (const auto& [action, stage] : actions) {
    for (size_t b : before) {
      if (log[b].stream.first != log[action].stream.first) continue;  // another device
      ASSERT_TRUE(RecordingGuard::happens_before(log, b, action))
          << where << ": " << log[action].label << " of stage " << stage << " may run before the caller's "
          << log[b].label;
    }
    for (size_t a : after) {
      if (log[a].stream.first != log[action].stream.first) continue;
      ASSERT_TRUE(RecordingGuard::happens_before(log, action, a))
          << where << ": " << log[action].label << " of stage " << stage << " may still run during the caller's "
          << log[a].label;
    }
  }
}

void check_order(const OrderCase& c) {
  FakeAccelerator fake(c.devices);
  RecordingGuard& guard = fake.guard();
  std::vector<int> devices;
  for (int d = 0; d < std::min(c.workers, c.devices); ++d) devices.push_back(d);
  torch::manual_seed(7);
  auto model = testing::make_mlp();
  // Without timelines, whose events the host reads after each step.
  auto options = PipelineOptions().workers(c.workers).microbatches(4).schedule(c.schedule).trace(false);
  if (c.pipeline_optimizer) {
    options.optimizer([&](std::vector<at::Tensor> p) { return std::make_unique<NotedSgd>(p, guard, devices); });
  }
  StageRunner pipe(model, options);
  torch::optim::SGD caller_sgd(pipe.parameters(), torch::optim::SGDOptions(0.01));
  const bool update_on_caller = c.pipeline_optimizer && schedules::make_schedule(c.schedule, c.workers, 4).synchronous();
  for (int step = 0; step < 2; ++step) {
    const at::Tensor x = torch::randn({8, 8}, torch::kFloat64);
    const at::Tensor y = torch::randn({8, 3}, torch::kFloat64);
    const std::string where = c.name() + ", step " + std::to_string(step);
    // The caller's work before the step: its optimizer (or, with the
    // pipeline's, a checkpoint load or anything else it does to weights).
    const std::vector<size_t> before = guard.work("work before step " + std::to_string(step), devices);
    if (!c.pipeline_optimizer) caller_sgd.step();
    pipe.train_step(x, y, testing::mse);
    const std::deque<Entry> log = guard.log();
    std::vector<size_t> after = guard.work("work after step " + std::to_string(step), devices);
    if (update_on_caller) {
      for (size_t i = before.back() + 1; i < log.size(); ++i) {
        if (log[i].kind == Entry::kWork && log[i].label == "pipeline optimizer") after.push_back(i);
      }
    }
    if (!c.pipeline_optimizer) caller_sgd.zero_grad();
    expect_fenced(guard, fake.notes().take(), before, after, where);
  }
  // A forward returns without a host synchronize: only the end fence orders
  // its work before what the caller queues next.
  const std::vector<size_t> before = guard.work("work before forward", devices);
  (void)pipe.forward(torch::randn({8, 8}, torch::kFloat64));
  const std::vector<size_t> after = guard.work("work after forward", devices);
  expect_fenced(guard, fake.notes().take(), before, after, c.name() + ", forward");
}

TEST(StreamOrder, EveryActionComesAfterTheCallersWorkAndBeforeWhatItQueuesNext) {
  for (const std::string& schedule : schedules::schedule_names()) {
    // The asynchronous schedules step the pipeline's own optimizer as they go.
    const bool synchronous = schedules::make_schedule(schedule, 2, 4).synchronous();
    for (const bool pipeline_optimizer : {false, true}) {
      if (!synchronous && !pipeline_optimizer) continue;
      check_order({schedule, 2, 1, pipeline_optimizer});
      check_order({schedule, 2, 2, pipeline_optimizer});
    }
  }
  check_order({"1f1b", 4, 1, false});
  check_order({"zb-h1", 3, 2, true});  // workers 0 and 2 on device 0, worker 1 on device 1
}

}  // namespace
}  // namespace conveyor
