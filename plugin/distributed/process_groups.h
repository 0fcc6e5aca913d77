#pragma once
// Process groups of a hybrid job: D data-parallel replicas of a K-worker
// pipeline over world = D x K processes, one worker per process (a worker
// runs one stage, or several under an interleaved schedule).
//
// Layout: rank r is worker r % K of replica r / K, so one replica's workers
// are consecutive ranks (a node of K GPUs holds a whole pipeline when K
// divides the GPUs per node; the gradient all-reduce then crosses nodes).
// Every rank is a member of three groups, made over the job's TCPStore with a
// PrefixStore each:
//   world      all D x K ranks       (the global loss, the data-parallel baseline)
//   pipeline   the K ranks of its replica, group rank = worker  (activations, gradients, barriers)
//   replicas   the D ranks of its worker, group rank = replica  (gradient all-reduce, weight broadcast)
//
// Rendezvous follows torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
// MASTER_PORT. Rank 0 hosts the store at MASTER_ADDR:MASTER_PORT, so the same
// program runs under `torchrun --nproc-per-node=N --no-python ./prog` on one
// machine or under a multi-node torchrun unchanged.

#include "plugin/core/option_list.h"

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/nn/module.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace conveyor {

// Where this process sits in the job, as torchrun describes it.
struct LaunchEnvironment {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // torchrun's agent already serves the store (TORCHELASTIC_USE_AGENT_STORE):
  // every rank is a client, and keys live under this restart's prefix
  // (TORCHELASTIC_RESTART_COUNT), so a restarted job never reads stale ones.
  bool agent_store = false;
  int restart_count = 0;

  // Reads the torchrun variables. With none of them set, a single process
  // (rank 0 of 1) on 127.0.0.1; with some but not all, or a malformed one,
  // throws std::invalid_argument naming the variable.
  static LaunchEnvironment from_environment();
};

// A write to a connection that the peer has closed raises SIGPIPE, whose
// default action kills the process without a word: Gloo and the TCP store
// write without MSG_NOSIGNAL, so a rank that dies (or closes its sockets)
// could take a surviving peer down with it instead of that peer failing with
// an error that names the dead rank. Python ignores SIGPIPE from the start; a
// C++ program does not. So, while SIGPIPE has its default action, this sets
// it to be ignored (the write then fails with EPIPE, which Gloo reports); a
// handler or disposition the program chose is left alone. connect_store and
// every group ProcessGroups connects call it. Returns whether it changed
// the disposition.
bool ignore_broken_pipes();

// The job's key-value store: rank 0 serves it at MASTER_ADDR:MASTER_PORT (or
// torchrun's agent does) and every rank connects, waiting at most `timeout`
// for the others. Ignores SIGPIPE unless the program chose what it does
// (ignore_broken_pipes).
c10::intrusive_ptr<c10d::Store> connect_store(const LaunchEnvironment& env, std::chrono::milliseconds timeout);

struct HybridLayout {
  int replicas = 1;  // D
  int workers = 1;   // K: the pipeline's workers, one process each

  // D = world_size / stages; throws std::invalid_argument unless K divides the world.
  static HybridLayout for_world(int world_size, int workers);

  int world_size() const { return replicas * workers; }
  int replica_of(int rank) const { return rank / workers; }
  int worker_of(int rank) const { return rank % workers; }
  int rank_of(int replica, int worker) const { return replica * workers + worker; }
  std::vector<int> pipeline_ranks(int replica) const;  // its K ranks, by worker
  std::vector<int> replica_ranks(int worker) const;    // its D ranks, by replica
};

class ProcessGroups {
 public:
  struct Options {
    // Upper bound on every collective and point-to-point wait once connected
    // (default: the pipeline's timeout option's).
    std::chrono::milliseconds timeout = RunningOptions{}.timeout;
    // Upper bound on connecting the groups (every rank must have started).
    std::chrono::milliseconds connect_timeout{std::chrono::minutes(5)};
    // Prefix of the groups' keys in the store: several sets of groups can
    // share one store under different names.
    std::string name = "conveyor";
    // Also make NCCL groups (pipeline and replicas) for CUDA tensors. Needs a
    // LibTorch with NCCL; an error otherwise.
    bool accelerator_groups = false;
  };

  // Collective over every rank of the layout: each makes the three groups it
  // belongs to. Throws (naming the group) if a peer does not connect in time.
  ProcessGroups(c10::intrusive_ptr<c10d::Store> store, int rank, HybridLayout layout, Options options);
  // Groups the caller made, e.g. torch.distributed's from Python (the
  // conveyor package hands them over): `pipeline` holds the K processes of
  // this rank's replica, its group rank being the worker; `replicas` the D
  // processes that run the same worker, its group rank being the replica
  // (null for D = 1). The device groups, when given, carry CUDA tensors.
  // There is no world group: what needs every rank (the loss, the barrier)
  // goes over the pipeline group, then the replicas group. Options::name,
  // connect_timeout and accelerator_groups do not apply.
  ProcessGroups(c10::intrusive_ptr<c10d::Backend> pipeline, c10::intrusive_ptr<c10d::Backend> replicas,
                Options options, c10::intrusive_ptr<c10d::Backend> pipeline_device = {},
                c10::intrusive_ptr<c10d::Backend> replicas_device = {});
  // After a failure the groups are not destroyed (their destructors may wait
  // on a peer that is gone): the process is expected to exit.
  ~ProcessGroups();
  ProcessGroups(const ProcessGroups&) = delete;
  ProcessGroups& operator=(const ProcessGroups&) = delete;

  int rank() const { return rank_; }
  int replica() const { return layout_.replica_of(rank_); }
  int worker() const { return layout_.worker_of(rank_); }
  const HybridLayout& layout() const { return layout_; }
  const Options& options() const { return options_; }
  // "rank 3 (replica 1, worker 1)"
  std::string describe(int rank) const;

  // Null for groups the caller made (the second constructor).
  const c10::intrusive_ptr<c10d::Backend>& world() const { return world_; }
  const c10::intrusive_ptr<c10d::Backend>& pipeline() const { return pipeline_; }
  const c10::intrusive_ptr<c10d::Backend>& replicas() const { return replicas_; }
  // Null unless Options::accelerator_groups.
  const c10::intrusive_ptr<c10d::Backend>& pipeline_device() const { return pipeline_device_; }
  const c10::intrusive_ptr<c10d::Backend>& replicas_device() const { return replicas_device_; }

  // Marks the groups unusable (a peer failed or timed out): later collectives
  // throw at once, and the destructor abandons the groups instead of waiting.
  void mark_failed() { failed_ = true; }
  bool failed() const { return failed_; }

  // A barrier of the world group, bounded by the timeout (e.g. before exit,
  // so that rank 0 keeps serving the store until everyone is done).
  void barrier();

 private:
  int rank_;
  HybridLayout layout_;
  Options options_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> world_, pipeline_, replicas_, pipeline_device_, replicas_device_;
  std::atomic<bool> failed_{false};
};

// "ranks [0, 2, 4]", for messages that name a group by its members.
std::string ranks_text(const std::vector<int>& ranks);

// --- collectives bounded by the groups' timeout ---------------------------------
// Each names this rank and `what` in its error and marks the groups failed.
// `group` is one of `groups`' (world, pipeline or replicas).

// Waits for `work`; on failure or timeout throws "rank R (replica d, worker k):
// timed out after T ms <what>" (or "failed after ...").
void wait(ProcessGroups& groups, const c10::intrusive_ptr<c10d::Work>& work, const std::string& what);

// A collective in flight, started by a start_* function below: calling it
// waits (bounded by the groups' timeout, as wait() is) and writes the result
// where the synchronous function would. Call it once; dropped uncalled, the
// result is lost and the tensors given stay as they were.
using PendingCollective = std::function<void()>;

// Sums (or averages) `tensors` in place across `group`. Tensors of one dtype
// and device travel as one flat buffer.
void all_reduce(ProcessGroups& groups, c10d::Backend& group, const std::vector<at::Tensor>& tensors, bool average,
                const std::string& what);
// all_reduce, started: `tensors` are copied into the flat buffers now, and
// may change meanwhile without changing the sum.
PendingCollective start_all_reduce(ProcessGroups& groups, c10d::Backend& group, const std::vector<at::Tensor>& tensors,
                                   bool average, const std::string& what);

// Sums `tensors` in place across every rank of the layout: over the world
// group, or, where there is none, over the pipeline group and then the
// replicas group.
void all_reduce_everywhere(ProcessGroups& groups, const std::vector<at::Tensor>& tensors, const std::string& what);

// Sums `values` in place across `group`, or takes their maximum with `max`.
void all_reduce_values(ProcessGroups& groups, c10d::Backend& group, at::Tensor& values, bool max,
                       const std::string& what);

// Starts summing (or averaging) across `group` the rows of `rows` ([group
// size, n], row j for group rank j): `mine` ([n]) holds this rank's row of
// the sum once the pending collective is called (`rows` must not change
// meanwhile).
PendingCollective start_reduce_scatter(ProcessGroups& groups, c10d::Backend& group, const at::Tensor& rows,
                                       at::Tensor mine, bool average, const std::string& what);

// Every group rank's `mine` ([n]) into row j of `rows` ([group size, n]).
void all_gather(ProcessGroups& groups, c10d::Backend& group, const at::Tensor& mine, at::Tensor& rows,
                const std::string& what);

// Overwrites `tensors` with group rank `root`'s values.
void broadcast(ProcessGroups& groups, c10d::Backend& group, const std::vector<at::Tensor>& tensors, int root,
               const std::string& what);

// A module's parameters, then its buffers: what a broadcast of its weights sends.
std::vector<at::Tensor> weights_and_buffers(const torch::nn::Module& module);

}  // namespace conveyor
