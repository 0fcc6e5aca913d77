#include "plugin/transport/shared_memory.h"

#include "plugin/support/timing.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <new>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>

namespace conveyor {

namespace shared_memory_detail {

constexpr uint64_t kRingMagic = 0x436f6e766579'0001ULL;

// A process and the moment it started: a pid alone may be reused, and two
// pid namespaces may share one /dev/shm.
struct ProcessIdentity {
  int64_t pid = 0;
  int64_t start = 0;  // /proc/<pid>/stat's starttime, clock ticks since boot
};

// The start of a segment; the ring's bytes follow at kDataOffset.
struct RingHeader {
  uint64_t magic = kRingMagic;
  int64_t capacity = 0;
  ProcessIdentity writer, reader;
  alignas(64) std::atomic<uint64_t> head{0};  // bytes written, ever
  alignas(64) std::atomic<uint64_t> tail{0};  // bytes read, ever
  alignas(64) std::atomic<uint32_t> written{0};  // futex: bumped after each record
  std::atomic<uint32_t> reader_waiting{0};
  alignas(64) std::atomic<uint32_t> freed{0};  // futex: bumped after each drain
  std::atomic<uint32_t> writer_waiting{0};
};
}  // namespace shared_memory_detail

using namespace shared_memory_detail;

namespace {

using std::chrono::milliseconds;

constexpr uint64_t kWrapTag = ~uint64_t{0};  // the tag of "the ring goes on at its start"
constexpr int64_t kRecordBytes = 16;     // tag, bytes
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free);

int64_t padded16(int64_t n) { return (n + 15) & ~int64_t{15}; }

// (state, starttime) of process `pid`, or state 0 when it does not exist.
std::pair<char, int64_t> proc_status(int64_t pid) {
  std::ifstream file("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  const auto close = std::getline(file, line) ? line.rfind(')') : std::string::npos;
  if (close == std::string::npos) return {0, 0};
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  std::pair<char, int64_t> status{0, 0};  // state, starttime
  for (int index = 3; rest >> field && index <= 22; ++index) {  // fields numbered as proc(5)
    if (index == 3) status.first = field.empty() ? 0 : field[0];
    if (index == 22) status.second = std::stoll(field);
  }
  return status;
}

ProcessIdentity this_process_identity() { return {getpid(), proc_status(getpid()).second}; }

// Whether the process still runs: not gone, not a zombie, not another one with its pid.
bool process_runs(const ProcessIdentity& p) {
  const auto [state, start] = proc_status(p.pid);
  return state != 0 && state != 'Z' && state != 'X' && start == p.start;
}

void futex_wait(std::atomic<uint32_t>* word, uint32_t seen, milliseconds within) {
  const timespec timeout{static_cast<time_t>(within.count() / 1000), static_cast<long>(within.count() % 1000) * 1000000};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &timeout, nullptr, 0);
}
void futex_wake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

constexpr int64_t kDataOffset = (sizeof(RingHeader) + 63) / 64 * 64;

std::string ring_segment_name(int64_t token, int from, int to) {
  return c10::str("/conveyor-", static_cast<uint64_t>(token), "-", from, "-", to);
}

std::vector<std::vector<int64_t>> gather_values(const c10::intrusive_ptr<c10d::Backend>& group,
                                            const std::vector<int64_t>& mine, milliseconds timeout,
                                            const std::string& what) {
  const int size = group->getSize();
  const auto options = at::TensorOptions().dtype(at::kLong);
  std::vector<at::Tensor> inputs{at::tensor(mine, options)};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < size; ++r) outputs[0].push_back(at::empty({static_cast<int64_t>(mine.size())}, options));
  auto work = group->allgather(outputs, inputs);
  if (!work->wait(timeout)) throw std::runtime_error("conveyor: shared memory: " + what + " was aborted");
  std::vector<std::vector<int64_t>> all;
  for (const auto& t : outputs[0]) all.emplace_back(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
  return all;
}

}  // namespace

// One direction between two workers: this process's mapping of its segment.
struct RingEnd {
  int peer = 0;
  RingHeader* ring = nullptr;
  char* data = nullptr;
  size_t mapped = 0;
  ProcessIdentity other;  // the process at the other end
  std::mutex mutex;       // this process's users of the ring: one writes (or drains) at a time
  std::map<int64_t, std::deque<std::vector<char>>> arrived;  // drained, not yet taken: tag -> messages

  RingEnd(int peer, void* map, size_t bytes) : peer(peer), ring(static_cast<RingHeader*>(map)), mapped(bytes) {
    data = static_cast<char*>(map) + kDataOffset;
  }
  ~RingEnd() { munmap(ring, mapped); }

  // Moves every record in the ring into `arrived`. Caller holds `mutex`.
  void drain() {
    uint64_t tail = ring->tail.load(std::memory_order_relaxed);
    const uint64_t head = ring->head.load(std::memory_order_acquire);
    if (tail == head) return;
    const auto capacity = static_cast<uint64_t>(ring->capacity);
    while (tail != head) {
      const char* record = data + tail % capacity;
      uint64_t tag = 0, bytes = 0;
      std::memcpy(&tag, record, 8);
      std::memcpy(&bytes, record + 8, 8);
      if (tag == kWrapTag) {
        tail += capacity - tail % capacity;
        continue;
      }
      arrived[static_cast<int64_t>(tag)].emplace_back(record + kRecordBytes, record + kRecordBytes + bytes);
      tail += static_cast<uint64_t>(kRecordBytes + padded16(static_cast<int64_t>(bytes)));
    }
    ring->tail.store(tail, std::memory_order_release);
    ring->freed.fetch_add(1);
    if (ring->writer_waiting.load()) futex_wake(&ring->freed);
  }
};

struct SharedMemoryLinks::State {
  std::vector<std::unique_ptr<RingEnd>> out, in;  // by peer worker; null: no link
  std::atomic<bool> aborted{false};
  std::string prefix;  // "worker 1"

  static RingEnd* end(const std::vector<std::unique_ptr<RingEnd>>& ends, int peer) {
    return peer >= 0 && peer < static_cast<int>(ends.size()) ? ends[peer].get() : nullptr;
  }
  RingEnd* incoming(int peer) const { return end(in, peer); }
  RingEnd* outgoing(int peer) const { return end(out, peer); }

  // Between slices of a wait: throws if the wait cannot go on. The peer's
  // process is looked up once per kPollMilliseconds (`checked`: when last).
  void check(const RingEnd& link, Clock::time_point deadline, const char* waiting_for,
             Clock::time_point& checked) const {
    if (aborted.load()) throw std::runtime_error("conveyor: shared memory: aborted");
    const auto now = Clock::now();
    if (now - checked >= milliseconds(kPollMilliseconds) && (checked = now, !process_runs(link.other))) {
      throw std::runtime_error(c10::str("worker ", link.peer, "'s process (pid ", link.other.pid,
                                        ") has exited; its shared-memory link is closed"));
    }
    if (now >= deadline) {
      throw std::runtime_error(c10::str("timed out waiting for ", waiting_for, " worker ", link.peer));
    }
  }
};

namespace {

// A receive from a link: wait() drains the ring until the message is there.
class SharedMemoryReceive final : public c10d::Work {
 public:
  SharedMemoryReceive(std::shared_ptr<SharedMemoryLinks::State> state, RingEnd* link, int64_t tag, at::Tensor buffer)
      : state_(std::move(state)), link_(link), tag_(tag), buffer_(std::move(buffer)) {}

  bool isCompleted() override { return done_ || take(); }
  bool isSuccess() const override { return done_; }

  bool wait(milliseconds timeout) override {
    const auto deadline = timeout == ::kNoTimeout ? Clock::time_point::max() : Clock::now() + timeout;
    RingHeader& ring = *link_->ring;
    auto checked = Clock::now();
    for (;;) {
      if (take()) return true;
      if (aborted_.load() || state_->aborted.load()) return false;  // the transport's abort: no error of its own
      state_->check(*link_, deadline, "a message from", checked);
      ring.reader_waiting.store(1);
      const uint32_t seen = ring.written.load();
      if (ring.head.load() == ring.tail.load()) {
        const auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now());
        futex_wait(&ring.written, seen, std::clamp(left, milliseconds(1), milliseconds(SharedMemoryLinks::kPollMilliseconds)));
      }
      ring.reader_waiting.store(0);
    }
  }

  void abort() override {
    aborted_ = true;
    futex_wake(&link_->ring->written);
  }

 private:
  bool take() {
    if (done_) return true;
    std::lock_guard<std::mutex> lock(link_->mutex);
    link_->drain();
    const auto it = link_->arrived.find(tag_);
    if (it == link_->arrived.end() || it->second.empty()) return false;
    const std::vector<char> message = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) link_->arrived.erase(it);
    const auto bytes = static_cast<int64_t>(message.size());
    TORCH_CHECK(bytes <= static_cast<int64_t>(buffer_.nbytes()), "conveyor: shared memory: a message of ", bytes,
                " bytes from worker ", link_->peer, " does not fit its ", buffer_.nbytes(), "-byte buffer");
    std::memcpy(buffer_.mutable_data_ptr(), message.data(), message.size());
    done_ = true;
    return true;
  }

  std::shared_ptr<SharedMemoryLinks::State> state_;
  RingEnd* link_;
  int64_t tag_;
  at::Tensor buffer_;
  std::atomic<bool> done_{false}, aborted_{false};
};

}  // namespace

SharedMemoryLinks::SharedMemoryLinks(const c10::intrusive_ptr<c10d::Backend>& group, int64_t ring_bytes,
                                     milliseconds timeout)
    : state_(std::make_shared<State>()) {
  const int size = group->getSize(), me = group->getRank();
  const int64_t capacity = padded16(std::max<int64_t>(ring_bytes, 1 << 16));
  State& s = *state_;
  s.out.resize(size);
  s.in.resize(size);
  s.prefix = c10::str("worker ", me);
  if (size < 2) return;
  const int previous = (me + size - 1) % size, next = (me + 1) % size;
  std::set<int> neighbours{previous, next};

  // 1. Each worker names itself; 2. makes its outgoing rings; 3. opens its
  // incoming ones and says which; then a ring is used iff both ends mapped it.
  std::random_device entropy;
  const int64_t token = static_cast<int64_t>((uint64_t{entropy()} << 32) ^ entropy());
  const ProcessIdentity self = this_process_identity();
  const auto who = gather_values(group, {token, self.pid, self.start}, timeout, "naming the workers");
  const size_t map_bytes = static_cast<size_t>(kDataOffset + capacity);
  // Unlinked once both ends mapped them, or when this constructor throws.
  struct Created : std::vector<std::string> {
    ~Created() { std::for_each(begin(), end(), [](const std::string& name) { shm_unlink(name.c_str()); }); }
  } created;
  for (const int peer : neighbours) {
    const std::string name = ring_segment_name(token, me, peer);
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) continue;
    created.push_back(name);
    // Reserved now: a tmpfs that runs out of room later (a container's small
    // /dev/shm) would kill the process at a write into the mapping (SIGBUS).
    void* map = ftruncate(fd, static_cast<off_t>(map_bytes)) == 0 &&
                        posix_fallocate(fd, 0, static_cast<off_t>(map_bytes)) == 0
                    ? mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                    : MAP_FAILED;
    close(fd);
    if (map == MAP_FAILED) continue;
    auto* ring = new (map) RingHeader();
    ring->capacity = capacity;
    ring->writer = self;
    ring->reader = {who[peer][1], who[peer][2]};
    s.out[peer] = std::make_unique<RingEnd>(peer, map, map_bytes);
    s.out[peer]->other = ring->reader;
  }
  gather_values(group, {1}, timeout, "making the rings");
  std::vector<int64_t> opened{0, 0};  // whether this worker opened its previous, its next neighbour's ring
  for (const int peer : neighbours) {
    const std::string name = ring_segment_name(who[peer][0], peer, me);
    const int fd = shm_open(name.c_str(), O_RDWR, 0600);
    if (fd < 0) continue;
    struct stat info {};
    void* map = fstat(fd, &info) == 0 && info.st_size == static_cast<off_t>(map_bytes)
                    ? mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                    : MAP_FAILED;
    close(fd);
    if (map == MAP_FAILED) continue;
    auto link = std::make_unique<RingEnd>(peer, map, map_bytes);
    const RingHeader& ring = *link->ring;
    // The writer must be the process that named itself, and seen from here
    // (one pid namespace), or a dead peer would go unnoticed.
    if (ring.magic != kRingMagic || ring.capacity != capacity || ring.writer.pid != who[peer][1] ||
        ring.writer.start != who[peer][2] || !process_runs(ring.writer)) {
      continue;
    }
    link->other = ring.writer;
    s.in[peer] = std::move(link);
    opened[0] |= peer == previous;
    opened[1] |= peer == next;
  }
  const auto flags = gather_values(group, opened, timeout, "opening the rings");
  for (const auto& name : created) shm_unlink(name.c_str());
  created.clear();
  // My ring to a neighbour is used iff it opened it (its flag for its next neighbour if that is me, else previous).
  for (const int peer : neighbours) {
    if (!flags[peer][me == (peer + 1) % size ? 1 : 0]) s.out[peer].reset();
  }
}

SharedMemoryLinks::~SharedMemoryLinks() { abort(); }

bool SharedMemoryLinks::sends_to(int peer) const { return state_->outgoing(peer) != nullptr; }
bool SharedMemoryLinks::receives_from(int peer) const { return state_->incoming(peer) != nullptr; }
int SharedMemoryLinks::links() const {
  const auto made = [](const auto& ends) { return std::count_if(ends.begin(), ends.end(), [](auto& e) { return !!e; }); };
  return static_cast<int>(made(state_->out) + made(state_->in));
}

void SharedMemoryLinks::send(int peer, int64_t tag, const void* bytes_at, int64_t bytes,
                             Clock::time_point deadline) {
  State& s = *state_;
  RingEnd* link = s.outgoing(peer);
  TORCH_CHECK(link, "conveyor: shared memory: no link from ", s.prefix, " to worker ", peer);
  RingHeader& ring = *link->ring;
  const auto capacity = static_cast<uint64_t>(ring.capacity);
  const auto need = static_cast<uint64_t>(kRecordBytes + padded16(bytes));
  TORCH_CHECK(tag >= 0 && 2 * need <= capacity, "conveyor: shared memory: a message of ", bytes,
              " bytes does not fit a ring of ", capacity, " bytes twice");
  std::lock_guard<std::mutex> lock(link->mutex);
  auto checked = Clock::now();
  for (;;) {
    uint64_t head = ring.head.load(std::memory_order_relaxed);
    const uint64_t tail = ring.tail.load(std::memory_order_acquire);
    const uint64_t to_end = capacity - head % capacity;
    const uint64_t want = need <= to_end ? need : to_end + need;
    if (capacity - (head - tail) >= want) {
      if (need > to_end) {
        std::memcpy(link->data + head % capacity, &kWrapTag, 8);
        head += to_end;
      }
      char* record = link->data + head % capacity;
      const auto t = static_cast<uint64_t>(tag), n = static_cast<uint64_t>(bytes);
      std::memcpy(record, &t, 8);
      std::memcpy(record + 8, &n, 8);
      std::memcpy(record + kRecordBytes, bytes_at, static_cast<size_t>(bytes));
      ring.head.store(head + need, std::memory_order_release);
      ring.written.fetch_add(1);
      if (ring.reader_waiting.load()) futex_wake(&ring.written);
      return;
    }
    // Full: take what the peer sent this process meanwhile (it may be
    // waiting for room too), then wait for the peer to drain.
    for (const auto& in : s.in) {
      if (!in) continue;
      std::lock_guard<std::mutex> in_lock(in->mutex);
      in->drain();
    }
    s.check(*link, deadline, "room in the ring to", checked);
    ring.writer_waiting.store(1);
    const uint32_t seen = ring.freed.load();
    if (ring.tail.load() == tail) futex_wait(&ring.freed, seen, milliseconds(kPollMilliseconds));
    ring.writer_waiting.store(0);
  }
}

c10::intrusive_ptr<c10d::Work> SharedMemoryLinks::receive(int peer, int64_t tag, at::Tensor buffer) {
  RingEnd* link = state_->incoming(peer);
  TORCH_CHECK(link, "conveyor: shared memory: no link to ", state_->prefix, " from worker ", peer);
  TORCH_CHECK(buffer.is_cpu() && buffer.is_contiguous(), "conveyor: shared memory receives into host memory");
  return c10::make_intrusive<SharedMemoryReceive>(state_, link, tag, std::move(buffer));
}

void SharedMemoryLinks::abort() {
  state_->aborted = true;
  for (const auto& in : state_->in) {
    if (in) futex_wake(&in->ring->written);
  }
}

}  // namespace conveyor
