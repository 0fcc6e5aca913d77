#include "plugin/distributed/process_groups.h"

#include "plugin/distributed/gloo_group.h"
#include "plugin/core/errors.h"
#include "plugin/support/timing.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(USE_C10D_NCCL) && defined(CONVEYOR_WITH_CUDA)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <csignal>
#include <charconv>
#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>

namespace conveyor {

namespace {


const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value && *value ? value : nullptr;
}

int parse_int(const char* name, const char* text, int min, int max) {
  int value = 0;
  const char* end = text + std::char_traits<char>::length(text);
  const auto [ptr, ec] = std::from_chars(text, end, value);
  check_argument(ec == std::errc() && ptr == end && value >= min && value <= max, "conveyor: ", name, "='", text,
                 "' is not an integer in [", min, ", ", max, "]");
  return value;
}

}  // namespace

std::string ranks_text(const std::vector<int>& ranks) {
  std::ostringstream os;
  os << "ranks [";
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  os << "]";
  return os.str();
}

LaunchEnvironment LaunchEnvironment::from_environment() {
  LaunchEnvironment e;
  const char* rank = env("RANK");
  const char* world = env("WORLD_SIZE");
  const char* addr = env("MASTER_ADDR");
  const char* port = env("MASTER_PORT");
  if (!rank && !world && !addr && !port) return e;  // a single process
  const std::pair<const char*, const char*> required[] = {
      {"RANK", rank}, {"WORLD_SIZE", world}, {"MASTER_ADDR", addr}, {"MASTER_PORT", port}};
  for (const auto& [name, value] : required) {
    if (!value) {
      throw std::invalid_argument(std::string("conveyor: ") + name +
                                  " is not set, but other torchrun variables are (RANK, WORLD_SIZE, MASTER_ADDR, "
                                  "MASTER_PORT are all needed; launch with torchrun)");
    }
  }
  e.world_size = parse_int("WORLD_SIZE", world, 1, 1 << 20);
  e.rank = parse_int("RANK", rank, 0, e.world_size - 1);
  const char* local = env("LOCAL_RANK");
  e.local_rank = local ? parse_int("LOCAL_RANK", local, 0, e.world_size - 1) : e.rank;
  e.master_addr = addr;
  e.master_port = parse_int("MASTER_PORT", port, 1, 65535);
  const char* agent = env("TORCHELASTIC_USE_AGENT_STORE");
  e.agent_store = agent && std::string(agent) == "True";
  const char* restarts = env("TORCHELASTIC_RESTART_COUNT");
  e.restart_count = restarts ? parse_int("TORCHELASTIC_RESTART_COUNT", restarts, 0, 1 << 30) : 0;
  return e;
}

bool ignore_broken_pipes() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) != 0) return false;
  if ((current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL) return false;
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  return ::sigaction(SIGPIPE, &ignore, nullptr) == 0;
}

c10::intrusive_ptr<c10d::Store> connect_store(const LaunchEnvironment& env, std::chrono::milliseconds timeout) {
  ignore_broken_pipes();
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(env.master_port);
  options.isServer = env.rank == 0 && !env.agent_store;
  options.numWorkers = static_cast<std::size_t>(env.world_size);
  options.waitWorkers = true;
  options.timeout = timeout;
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
    if (!env.agent_store) return store;
    return c10::make_intrusive<c10d::PrefixStore>(c10::str("/worker/attempt_", env.restart_count), store);
  } catch (const std::exception& e) {
    throw std::runtime_error(c10::str("conveyor: rank ", env.rank, " could not ", options.isServer ? "serve" : "reach",
                                      " the store at ", env.master_addr, ":", env.master_port, " within ",
                                      timeout.count(), " ms (are all ", env.world_size, " ranks started?) [",
                                      message_of(e), "]"));
  }
}

HybridLayout HybridLayout::for_world(int world_size, int workers) {
  check_argument(workers >= 1 && world_size >= 1 && world_size % workers == 0, "conveyor: a world of ", world_size,
                 " processes cannot hold replicas of a ", workers, "-worker pipeline: the number of workers must "
                 "divide WORLD_SIZE (world = replicas x workers)");
  return HybridLayout{world_size / workers, workers};
}

std::vector<int> HybridLayout::pipeline_ranks(int replica) const {
  std::vector<int> ranks;
  for (int k = 0; k < workers; ++k) ranks.push_back(rank_of(replica, k));
  return ranks;
}

std::vector<int> HybridLayout::replica_ranks(int worker) const {
  std::vector<int> ranks;
  for (int d = 0; d < replicas; ++d) ranks.push_back(rank_of(d, worker));
  return ranks;
}

ProcessGroups::ProcessGroups(c10::intrusive_ptr<c10d::Store> store, int rank, HybridLayout layout, Options options)
    : rank_(rank), layout_(layout), options_(std::move(options)), store_(std::move(store)) {
  check_argument(layout_.replicas >= 1 && layout_.workers >= 1,
                 "conveyor: a layout needs at least one replica and worker");
  check_argument(rank_ >= 0 && rank_ < layout_.world_size(), "conveyor: rank ", rank_, " is outside the world of ",
                 layout_.world_size(), " = ", layout_.replicas, " replicas x ", layout_.workers, " workers");
  TORCH_CHECK(options_.timeout.count() > 0 && options_.connect_timeout.count() > 0,
              "conveyor: the process-group timeouts must be positive");
  const auto make = [&](const std::string& name, const std::vector<int>& ranks, bool accelerator) {
    const int group_rank = static_cast<int>(std::find(ranks.begin(), ranks.end(), rank_) - ranks.begin());
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(options_.name + "/" + name, store_);
    try {
      if (accelerator) {
#if defined(USE_C10D_NCCL) && defined(CONVEYOR_WITH_CUDA)
        auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
        nccl_options->timeout = options_.timeout;
        return c10::intrusive_ptr<c10d::Backend>(c10::make_intrusive<c10d::ProcessGroupNCCL>(
            prefixed, group_rank, static_cast<int>(ranks.size()), nccl_options));
#else
        throw std::invalid_argument("this LibTorch (or this build of conveyor) has no NCCL");
#endif
      }
      ignore_broken_pipes();
      return make_gloo_group(prefixed, group_rank, static_cast<int>(ranks.size()), options_.connect_timeout,
                             options_.timeout);
    } catch (const std::exception& e) {
      failed_ = true;
      throw std::runtime_error(c10::str(describe(rank_), ": could not connect the ", name, " group (",
                                        ranks_text(ranks), ") within ", options_.connect_timeout.count(), " ms [",
                                        message_of(e), "]"));
    }
  };
  std::vector<int> everyone(layout_.world_size());
  for (int r = 0; r < layout_.world_size(); ++r) everyone[r] = r;
  // Every rank makes its groups in the same order, so no connect waits on
  // a group that a peer makes later.
  world_ = make("world", everyone, false);
  const std::string pipeline_name = c10::str("pipeline", replica());
  const std::string replicas_name = c10::str("replicas", worker());
  pipeline_ = make(pipeline_name, layout_.pipeline_ranks(replica()), false);
  replicas_ = make(replicas_name, layout_.replica_ranks(worker()), false);
  if (options_.accelerator_groups) {
    pipeline_device_ = make(pipeline_name + "-device", layout_.pipeline_ranks(replica()), true);
    replicas_device_ = make(replicas_name + "-device", layout_.replica_ranks(worker()), true);
  }
}

namespace {

// The replicas group of a pipeline that is not replicated: one rank, for
// which every collective is a no-op (all_reduce and broadcast return before
// calling it), so that no code path needs a null check.
class SoloGroup final : public c10d::Backend {
 public:
  SoloGroup() : Backend(0, 1) {}
  const std::string getBackendName() const override { return "conveyor-solo"; }
};

}  // namespace

ProcessGroups::ProcessGroups(c10::intrusive_ptr<c10d::Backend> pipeline, c10::intrusive_ptr<c10d::Backend> replicas,
                             Options options, c10::intrusive_ptr<c10d::Backend> pipeline_device,
                             c10::intrusive_ptr<c10d::Backend> replicas_device)
    : rank_(0),
      options_(std::move(options)),
      pipeline_(std::move(pipeline)),
      replicas_(std::move(replicas)),
      pipeline_device_(std::move(pipeline_device)),
      replicas_device_(std::move(replicas_device)) {
  check_argument(static_cast<bool>(pipeline_), "conveyor: ProcessGroups needs a pipeline group");
  TORCH_CHECK(options_.timeout.count() > 0, "conveyor: the process-group timeout must be positive");
  if (!replicas_) replicas_ = c10::make_intrusive<SoloGroup>();
  layout_ = HybridLayout{replicas_->getSize(), pipeline_->getSize()};
  rank_ = layout_.rank_of(replicas_->getRank(), pipeline_->getRank());
  const auto same_shape = [](const c10::intrusive_ptr<c10d::Backend>& device, const c10d::Backend& host) {
    return !device || (device->getSize() == host.getSize() && device->getRank() == host.getRank());
  };
  check_argument(same_shape(pipeline_device_, *pipeline_) && same_shape(replicas_device_, *replicas_),
                 "conveyor: a device group must hold the same ranks as its group");
  ignore_broken_pipes();
}

ProcessGroups::~ProcessGroups() {
  if (!failed_) return;
  // A group whose peer died may wait for it in its destructor: abandon it.
  for (auto* group : {&world_, &pipeline_, &replicas_, &pipeline_device_, &replicas_device_}) {
    if (*group) (void)group->release();
  }
}

std::string ProcessGroups::describe(int rank) const {
  return c10::str("rank ", rank, " (replica ", layout_.replica_of(rank), ", worker ", layout_.worker_of(rank), ")");
}

void ProcessGroups::barrier() {
  TORCH_CHECK(!failed_, "conveyor: ", describe(rank_), ": the process groups failed earlier");
  c10d::BarrierOptions options;
  options.timeout = options_.timeout;
  const std::string what = c10::str("at the barrier of all ", layout_.world_size(), " ranks");
  if (world_) {
    wait(*this, world_->barrier(options), what);
    return;
  }
  wait(*this, pipeline_->barrier(options), what);
  if (replicas_->getSize() > 1) wait(*this, replicas_->barrier(options), what);
}

}  // namespace conveyor
