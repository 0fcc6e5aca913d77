// The collectives of plugin/distributed/process_groups.h, each bounded by the
// groups' timeout and named in its errors; the synchronous ones are their
// started forms, waited for at once.
#include "plugin/distributed/process_groups.h"

#include "plugin/core/errors.h"
#include "plugin/support/timing.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <functional>
#include <map>
#include <memory>
#include <stdexcept>

namespace conveyor {

void wait(ProcessGroups& groups, const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) {
  const auto start = Clock::now();
  const auto timeout = groups.options().timeout;
  try {
    if (work->wait(timeout)) return;
  } catch (const std::exception& e) {
    groups.mark_failed();
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    const std::string how = waited >= timeout
                                ? c10::str("timed out after ", timeout.count(), " ms ", what)
                                : c10::str("failed after ", waited.count(), " ms ", what, " (did a peer exit?)");
    throw std::runtime_error(c10::str(groups.describe(groups.rank()), ": ", how, " [", message_of(e), "]"));
  }
  groups.mark_failed();
  throw std::runtime_error(groups.describe(groups.rank()) + ": aborted " + what);
}

namespace {

// Tensors grouped by dtype and device, each group in the given order.
std::vector<std::vector<at::Tensor>> buckets_of(const std::vector<at::Tensor>& tensors) {
  std::map<std::pair<int, std::string>, size_t> index;
  std::vector<std::vector<at::Tensor>> buckets;
  for (const auto& t : tensors) {
    TORCH_CHECK(t.defined(), "conveyor: cannot reduce an undefined tensor");
    const auto key = std::make_pair(static_cast<int>(t.scalar_type()), t.device().str());
    auto it = index.find(key);
    if (it == index.end()) {
      it = index.emplace(key, buckets.size()).first;
      buckets.emplace_back();
    }
    buckets[it->second].push_back(t);
  }
  return buckets;
}

at::Tensor flatten(const std::vector<at::Tensor>& bucket) {
  std::vector<at::Tensor> flat;
  for (const auto& t : bucket) flat.push_back(t.detach().reshape({-1}));
  return at::cat(flat);
}

void unflatten(const at::Tensor& flat, const std::vector<at::Tensor>& bucket) {
  c10::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const auto& t : bucket) {
    t.detach().copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

// Starts a collective; a failure to start it is the groups' failure too.
c10::intrusive_ptr<c10d::Work> start(ProcessGroups& groups, const std::string& what,
                                     const std::function<c10::intrusive_ptr<c10d::Work>()>& collective) {
  TORCH_CHECK(!groups.failed(), "conveyor: ", groups.describe(groups.rank()), ": the process groups failed earlier");
  try {
    return collective();
  } catch (const std::exception& e) {
    groups.mark_failed();
    throw std::runtime_error(groups.describe(groups.rank()) + ": could not start " + what + " [" + message_of(e) + "]");
  }
}

}  // namespace

void all_reduce_everywhere(ProcessGroups& groups, const std::vector<at::Tensor>& tensors, const std::string& what) {
  if (groups.world()) {
    all_reduce(groups, *groups.world(), tensors, false, what);
    return;
  }
  all_reduce(groups, *groups.pipeline(), tensors, false, what);
  all_reduce(groups, *groups.replicas(), tensors, false, what);
}

void all_reduce(ProcessGroups& groups, c10d::Backend& group, const std::vector<at::Tensor>& tensors, bool average,
                const std::string& what) {
  start_all_reduce(groups, group, tensors, average, what)();
}

PendingCollective start_all_reduce(ProcessGroups& groups, c10d::Backend& group, const std::vector<at::Tensor>& tensors,
                                   bool average, const std::string& what) {
  if (group.getSize() == 1 || tensors.empty()) return [] {};
  struct Bucket {
    std::vector<at::Tensor> tensors, flat;
    c10::intrusive_ptr<c10d::Work> work;
  };
  auto buckets = std::make_shared<std::vector<Bucket>>();
  for (auto& bucket : buckets_of(tensors)) {
    Bucket b{std::move(bucket), {}, {}};
    b.flat = {flatten(b.tensors)};
    c10d::AllreduceOptions options;
    options.timeout = groups.options().timeout;
    b.work = start(groups, what, [&] { return group.allreduce(b.flat, options); });
    buckets->push_back(std::move(b));
  }
  const int size = group.getSize();
  return [&groups, buckets, average, size, what] {
    for (Bucket& b : *buckets) {
      wait(groups, b.work, what);
      if (average) b.flat[0].div_(size);
      unflatten(b.flat[0], b.tensors);
    }
  };
}

void all_reduce_values(ProcessGroups& groups, c10d::Backend& group, at::Tensor& values, bool max,
                       const std::string& what) {
  if (group.getSize() == 1) return;
  std::vector<at::Tensor> list{values};
  c10d::AllreduceOptions options;
  options.reduceOp = max ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
  options.timeout = groups.options().timeout;
  wait(groups, start(groups, what, [&] { return group.allreduce(list, options); }), what);
}

PendingCollective start_reduce_scatter(ProcessGroups& groups, c10d::Backend& group, const at::Tensor& rows,
                                       at::Tensor mine, bool average, const std::string& what) {
  TORCH_CHECK(rows.dim() == 2 && rows.size(0) == group.getSize() && mine.numel() == rows.size(1),
              "conveyor: reduce_scatter of rows ", rows.sizes(), " into ", mine.sizes(), " over ", group.getSize(),
              " ranks");
  if (group.getSize() == 1) {
    mine.copy_(rows[0]);
    return [] {};
  }
  std::vector<at::Tensor> outputs{mine};
  std::vector<std::vector<at::Tensor>> inputs{rows.unbind(0)};
  c10d::ReduceScatterOptions options;
  options.timeout = groups.options().timeout;
  auto work = start(groups, what, [&] { return group.reduce_scatter(outputs, inputs, options); });
  const int size = group.getSize();
  // Kept to the wait (c10d's work holds its own references while in flight).
  return [&groups, work, rows, mine, average, size, what]() mutable {
    wait(groups, work, what);
    if (average) mine.div_(size);
  };
}

void all_gather(ProcessGroups& groups, c10d::Backend& group, const at::Tensor& mine, at::Tensor& rows,
                const std::string& what) {
  TORCH_CHECK(rows.dim() == 2 && rows.size(0) == group.getSize() && mine.numel() == rows.size(1),
              "conveyor: all_gather of ", mine.sizes(), " into rows ", rows.sizes(), " over ", group.getSize(),
              " ranks");
  if (group.getSize() == 1) {
    rows[0].copy_(mine);
    return;
  }
  std::vector<std::vector<at::Tensor>> outputs{rows.unbind(0)};
  std::vector<at::Tensor> inputs{mine};
  c10d::AllgatherOptions options;
  options.timeout = groups.options().timeout;
  wait(groups, start(groups, what, [&] { return group.allgather(outputs, inputs, options); }), what);
}

void broadcast(ProcessGroups& groups, c10d::Backend& group, const std::vector<at::Tensor>& tensors, int root,
               const std::string& what) {
  if (group.getSize() == 1 || tensors.empty()) return;
  for (const auto& bucket : buckets_of(tensors)) {
    std::vector<at::Tensor> flat{flatten(bucket)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    options.timeout = groups.options().timeout;
    wait(groups, start(groups, what, [&] { return group.broadcast(flat, options); }), what);
    if (group.getRank() != root) unflatten(flat[0], bucket);
  }
}

std::vector<at::Tensor> weights_and_buffers(const torch::nn::Module& module) {
  std::vector<at::Tensor> tensors = module.parameters();
  for (const auto& b : module.buffers()) tensors.push_back(b);
  return tensors;
}

}  // namespace conveyor
