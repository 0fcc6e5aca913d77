#include "plugin/distributed/sharded_optimizer.h"

#include "plugin/core/errors.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>

namespace conveyor {

namespace {

// Indices of `tensors` by dtype and device, in order: what one collective carries.
std::vector<std::vector<size_t>> by_dtype_and_device(const std::vector<at::Tensor>& tensors) {
  std::map<std::pair<int, std::string>, size_t> index;
  std::vector<std::vector<size_t>> buckets;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto key = std::make_pair(static_cast<int>(tensors[i].scalar_type()), tensors[i].device().str());
    auto it = index.find(key);
    if (it == index.end()) it = index.emplace(key, buckets.size()).first;
    if (it->second == buckets.size()) buckets.emplace_back();
    buckets[it->second].push_back(i);
  }
  return buckets;
}

// The replicas' group that carries `t`: NCCL's for a CUDA tensor where there is one.
c10d::Backend& group_for(ProcessGroups& groups, const at::Tensor& t) {
  return t.defined() && t.is_cuda() && groups.replicas_device() ? *groups.replicas_device() : *groups.replicas();
}

std::string replicas_text(ProcessGroups& groups) {
  const int k = groups.worker();
  return c10::str("worker ", k, "'s ", groups.layout().replicas, " replicas (",
                  ranks_text(groups.layout().replica_ranks(k)), ")");
}

// The same kind of optimizer as `full`, over the groups `g`, with its defaults.
std::unique_ptr<torch::optim::Optimizer> remake(const torch::optim::Optimizer& full,
                                                const std::vector<torch::optim::OptimizerParamGroup>& g) {
  using namespace torch::optim;
  const OptimizerOptions& d = full.defaults();
  if (dynamic_cast<const SGD*>(&full)) return std::make_unique<SGD>(g, static_cast<const SGDOptions&>(d));
  if (dynamic_cast<const Adam*>(&full)) return std::make_unique<Adam>(g, static_cast<const AdamOptions&>(d));
  if (dynamic_cast<const AdamW*>(&full)) return std::make_unique<AdamW>(g, static_cast<const AdamWOptions&>(d));
  if (dynamic_cast<const Adagrad*>(&full)) return std::make_unique<Adagrad>(g, static_cast<const AdagradOptions&>(d));
  if (dynamic_cast<const RMSprop*>(&full)) return std::make_unique<RMSprop>(g, static_cast<const RMSpropOptions&>(d));
  throw std::invalid_argument(
      c10::str("conveyor: sharded optimizer state (ZeRO-1 to 3) needs an optimizer whose update is elementwise (SGD, Adam, ",
               "AdamW, Adagrad, RMSprop), got ", c10::demangle(typeid(full).name())));
}

// Replaces each tensor of a parameter's state with f(tensor); an undefined one stays.
void map_state_tensors(torch::optim::OptimizerParamState& state,
                       const std::function<at::Tensor(const at::Tensor&)>& f) {
  using namespace torch::optim;
  auto apply = [&](const at::Tensor& t) { return t.defined() ? f(t) : t; };
  if (auto* s = dynamic_cast<SGDParamState*>(&state)) {
    s->momentum_buffer(apply(s->momentum_buffer()));
  } else if (auto* a = dynamic_cast<AdamParamState*>(&state)) {
    a->exp_avg(apply(a->exp_avg()));
    a->exp_avg_sq(apply(a->exp_avg_sq()));
    a->max_exp_avg_sq(apply(a->max_exp_avg_sq()));
  } else if (auto* w = dynamic_cast<AdamWParamState*>(&state)) {
    w->exp_avg(apply(w->exp_avg()));
    w->exp_avg_sq(apply(w->exp_avg_sq()));
    w->max_exp_avg_sq(apply(w->max_exp_avg_sq()));
  } else if (auto* g = dynamic_cast<AdagradParamState*>(&state)) {
    g->sum(apply(g->sum()));
  } else if (auto* r = dynamic_cast<RMSpropParamState*>(&state)) {
    r->square_avg(apply(r->square_avg()));
    r->momentum_buffer(apply(r->momentum_buffer()));
    r->grad_avg(apply(r->grad_avg()));
  } else {
    throw std::invalid_argument(c10::str("conveyor: no known optimizer keeps state of the kind ",
                                         c10::demangle(typeid(state).name())));
  }
}

// The state of `param` in `optimizer`, or null.
const torch::optim::OptimizerParamState* state_of(const torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  const auto it = optimizer.state().find(param.unsafeGetTensorImpl());
  return it == optimizer.state().end() ? nullptr : it->second.get();
}

}  // namespace

ShardLayout::ShardLayout(const std::vector<at::Tensor>& weights, int replicas_, int replica_)
    : replicas(replicas_), replica(replica_) {
  TORCH_CHECK(replicas >= 1 && replica >= 0 && replica < replicas, "conveyor: replica ", replica, " of ", replicas);
  for (const auto& w : weights) {
    numel.push_back(w.numel());
    piece.push_back((w.numel() + replicas - 1) / replicas);
  }
}

int64_t ShardLayout::owned(size_t i) const {
  return std::max<int64_t>(0, std::min(piece[i], numel[i] - replica * piece[i]));
}

at::Tensor ShardLayout::piece_of(size_t i, const at::Tensor& t) const {
  at::Tensor out = at::zeros({piece[i]}, t.options());
  const int64_t n = owned(i);
  if (n > 0) out.narrow(0, 0, n).copy_(t.detach().reshape({-1}).narrow(0, replica * piece[i], n));
  return out;
}

namespace {

// One reduce-scatter of a stage's gradients: the weights of one dtype and
// device, and this replica's pieces of their reduced gradients, one after the
// other, once `sum` is called.
struct ScatteredBucket {
  std::vector<size_t> weights;
  at::Tensor mine;
  PendingCollective sum;
};

// Starts reduce-scattering the gradients of `trained` (cut by `layout`),
// reading them now: a weight without a gradient contributes zeros.
std::vector<ScatteredBucket> start_scatter(ProcessGroups& groups, int stage, const std::vector<at::Tensor>& trained,
                                           const ShardLayout& layout, bool average) {
  const int replicas = layout.replicas;
  std::vector<ScatteredBucket> buckets;
  for (auto& bucket : by_dtype_and_device(trained)) {
    int64_t width = 0;
    for (size_t i : bucket) width += layout.piece[i];
    // Row d: every weight's piece d, one after the other (zero where a piece is padding).
    at::Tensor rows = at::zeros({replicas, width}, trained[bucket[0]].options());
    int64_t offset = 0;
    for (size_t i : bucket) {
      const at::Tensor& g = trained[i].grad();
      if (g.defined()) {
        const at::Tensor flat = g.reshape({-1});
        for (int d = 0; d < replicas; ++d) {
          const int64_t n = std::min(layout.piece[i], layout.numel[i] - d * layout.piece[i]);
          if (n > 0) rows[d].narrow(0, offset, n).copy_(flat.narrow(0, d * layout.piece[i], n));
        }
      }
      offset += layout.piece[i];
    }
    at::Tensor mine = at::empty({width}, rows.options());
    PendingCollective sum = start_reduce_scatter(
        groups, group_for(groups, rows), rows, mine, average,
        c10::str(average ? "averaging" : "summing", " the gradients of stage ", stage, " across ",
                 replicas_text(groups), " by reduce-scatter"));
    buckets.push_back({std::move(bucket), mine, std::move(sum)});
  }
  return buckets;
}

}  // namespace

PendingCollective start_reduce_scatter_gradients(ProcessGroups& groups, int stage,
                                                 const std::vector<at::Tensor>& weights, bool average) {
  std::vector<at::Tensor> trained;
  for (const auto& w : weights) {
    if (w.requires_grad()) trained.push_back(w);
  }
  auto layout = std::make_shared<const ShardLayout>(trained, groups.layout().replicas, groups.replica());
  c10::NoGradGuard no_grad;
  auto buckets = std::make_shared<std::vector<ScatteredBucket>>(start_scatter(groups, stage, trained, *layout, average));
  return [trained = std::move(trained), layout, buckets] {
    c10::NoGradGuard no_grad;
    for (ScatteredBucket& b : *buckets) {
      b.sum();
      int64_t offset = 0;
      for (size_t i : b.weights) {
        const at::Tensor& w = trained[i];
        if (!w.grad().defined() || !w.grad().is_contiguous()) {
          w.mutable_grad() = w.grad().defined() ? w.grad().contiguous() : at::zeros_like(w);
        }
        const at::Tensor flat = w.grad().view({-1});
        flat.zero_();
        const int64_t n = layout->owned(i);
        if (n > 0) flat.narrow(0, layout->replica * layout->piece[i], n).copy_(b.mine.narrow(0, offset, n));
        offset += layout->piece[i];
      }
    }
  };
}

PendingCollective start_reduce_scatter_into_pieces(ProcessGroups& groups, int stage,
                                                   const std::vector<at::Tensor>& weights,
                                                   const std::vector<at::Tensor>& pieces, bool average) {
  TORCH_CHECK(pieces.size() == weights.size(), "conveyor: stage ", stage, " has ", weights.size(), " weights but ",
              pieces.size(), " gradient pieces");
  std::vector<at::Tensor> trained, sinks;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!weights[i].requires_grad()) continue;
    trained.push_back(weights[i]);
    sinks.push_back(pieces[i]);
  }
  const ShardLayout layout(trained, groups.layout().replicas, groups.replica());
  c10::NoGradGuard no_grad;
  auto buckets = std::make_shared<std::vector<ScatteredBucket>>(start_scatter(groups, stage, trained, layout, average));
  // Read into the collective's rows: the whole gradients are released now,
  // and the stage's next backward starts new ones from zero.
  for (const auto& w : trained) w.mutable_grad() = at::Tensor();
  return [sinks = std::move(sinks), piece = layout.piece, buckets] {
    c10::NoGradGuard no_grad;
    for (ScatteredBucket& b : *buckets) {
      b.sum();
      int64_t offset = 0;
      for (size_t i : b.weights) {
        const at::Tensor part = b.mine.narrow(0, offset, piece[i]);
        at::Tensor& g = sinks[i].mutable_grad();
        g = g.defined() ? g.add_(part) : part;
        offset += piece[i];
      }
    }
  };
}

ShardedOptimizer::ShardedOptimizer(std::vector<at::Tensor> weights, const OptimizerFactory& factory,
                                   std::shared_ptr<ProcessGroups> groups, ShardLevel level)
    : ShardedOptimizer(weights, factory(weights), std::move(groups), level) {}

ShardedOptimizer::ShardedOptimizer(std::vector<at::Tensor> weights, std::unique_ptr<torch::optim::Optimizer> full,
                                   std::shared_ptr<ProcessGroups> groups, ShardLevel level)
    : Optimizer(std::vector<torch::optim::OptimizerParamGroup>{}, full->defaults().clone()),
      weights_(std::move(weights)),
      level_(level),
      layout_(weights_, groups->layout().replicas, groups->replica()),
      groups_(std::move(groups)) {
  TORCH_CHECK(level_ >= ShardLevel::kOptimizer,
              "conveyor: a sharded optimizer shards at least its state (shard \"optimizer\")");
  // `full`, the caller's optimizer over the whole weights, gives the kind, the groups and their options.
  std::unordered_map<const c10::TensorImpl*, size_t> index;
  for (size_t i = 0; i < weights_.size(); ++i) {
    index.emplace(weights_[i].unsafeGetTensorImpl(), i);
    pieces_.push_back(layout_.piece_of(i, weights_[i]).requires_grad_(true));
    if (level_ != ShardLevel::kParameters) continue;
    const c10::Storage& storage = weights_[i].storage();
    const auto same = [&](const Storage& s) { return s.impl.is_alias_of(storage); };
    if (std::none_of(storages_.begin(), storages_.end(), same)) storages_.push_back({storage, storage.nbytes()});
  }
  std::vector<torch::optim::OptimizerParamGroup> inner_groups;
  for (const auto& group : full->param_groups()) {
    std::vector<at::Tensor> pieces;
    for (const auto& p : group.params()) {
      const auto it = index.find(p.unsafeGetTensorImpl());
      check_argument(it != index.end(), "conveyor: the optimizer factory gave a sharded optimizer a tensor of shape ",
                     p.sizes(), " that is not one of the stage's weights");
      pieces.push_back(pieces_[it->second]);
    }
    inner_groups.emplace_back(pieces, group.options().clone());
    add_param_group(torch::optim::OptimizerParamGroup(group.params(), group.options().clone()));
  }
  inner_ = remake(*full, inner_groups);
}

at::Tensor ShardedOptimizer::step(LossClosure closure) {
  TORCH_CHECK(!closure, "conveyor: a sharded optimizer does not take a loss closure");
  // Options a schedule or the caller changed (the learning rate) reach the pieces' optimizer.
  for (size_t g = 0; g < param_groups().size(); ++g) {
    inner_->param_groups()[g].set_options(param_groups()[g].options().clone());
  }
  c10::NoGradGuard no_grad;
  // Below kParameters, from the weights as they are now: whatever set them
  // since the last step (the initial broadcast, tied copies made equal, a
  // checkpoint) counts. At kParameters the pieces are the weights.
  for (size_t i = 0; i < weights_.size() && level_ != ShardLevel::kParameters; ++i) {
    pieces_[i].copy_(layout_.piece_of(i, weights_[i]));
    if (level_ == ShardLevel::kGradients) continue;  // the pieces hold their gradients already
    const at::Tensor& g = weights_[i].grad();
    pieces_[i].mutable_grad() = g.defined() ? layout_.piece_of(i, g) : at::Tensor();
  }
  inner_->step();
  for (auto& p : pieces_) p.mutable_grad() = at::Tensor();
  if (level_ != ShardLevel::kParameters) gather_into_weights("gathering the updated weights of ");
  return {};
}

void ShardedOptimizer::gather_into_weights(const char* what) {
  c10::NoGradGuard no_grad;
  const int replicas = layout_.replicas;
  for (const auto& bucket : by_dtype_and_device(weights_)) {
    std::vector<at::Tensor> mine;
    for (size_t i : bucket) mine.push_back(pieces_[i].detach());
    const at::Tensor flat = at::cat(mine);
    at::Tensor rows = at::empty({replicas, flat.numel()}, flat.options());
    all_gather(*groups_, group_for(*groups_, flat), flat, rows, c10::str(what, replicas_text(*groups_)));
    int64_t offset = 0;
    for (size_t i : bucket) {
      const at::Tensor& w = weights_[i];
      const at::Tensor whole = rows.narrow(1, offset, layout_.piece[i]).reshape({-1}).narrow(0, 0, layout_.numel[i]);
      if (level_ == ShardLevel::kParameters) {
        // Through a tensor of its own over the storage: the weight's version
        // stays, and autograd reads the refilled values for those it saved.
        at::empty({0}, w.options()).set_(w.storage(), w.storage_offset(), w.sizes(), w.strides()).copy_(
            whole.view(w.sizes()));
      } else {
        w.detach().copy_(whole.view(w.sizes()));
      }
      offset += layout_.piece[i];
    }
  }
}

void ShardedOptimizer::gather_parameters() {
  allocate_parameters();
  gather_into_weights("gathering the sharded weights of ");
}

void ShardedOptimizer::release_parameters() {
  for (Storage& s : storages_) {
    if (s.impl.nbytes() == 0) continue;
    // On a GPU, this thread's queued readers end first (the memory is reused).
    if (s.impl.device_type() != c10::kCPU) {
      const c10::impl::VirtualGuardImpl device(s.impl.device_type());
      device.synchronizeStream(device.getStream(s.impl.device()));
    }
    s.impl.set_data_ptr_noswap(at::DataPtr(nullptr, s.impl.device()));
    s.impl.set_nbytes(0);
  }
}

bool ShardedOptimizer::parameters_whole() const {
  return std::all_of(storages_.begin(), storages_.end(), [](const Storage& s) { return s.impl.nbytes() == s.nbytes; });
}

void ShardedOptimizer::allocate_parameters() {
  for (Storage& s : storages_) {
    if (s.impl.nbytes() == s.nbytes) continue;
    const c10::OptionalDeviceGuard on_its_device(s.impl.device());  // the allocator takes the current device
    at::Allocator* allocator = s.impl.allocator() ? s.impl.allocator() : c10::GetAllocator(s.impl.device_type());
    s.impl.set_data_ptr_noswap(allocator->allocate(s.nbytes));
    s.impl.set_nbytes(s.nbytes);
  }
}

void ShardedOptimizer::shard_parameters() {
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < weights_.size(); ++i) pieces_[i].copy_(layout_.piece_of(i, weights_[i]));
  release_parameters();
}

const at::Tensor& ShardedOptimizer::weight_of_piece(const at::Tensor& piece) const {
  for (size_t i = 0; i < pieces_.size(); ++i) {
    if (pieces_[i].unsafeGetTensorImpl() == piece.unsafeGetTensorImpl()) return weights_[i];
  }
  throw std::invalid_argument(c10::str("conveyor: a tensor of shape ", piece.sizes(),
                                       " is not a piece of this sharded optimizer's weights"));
}

std::unique_ptr<torch::optim::Optimizer> ShardedOptimizer::whole_without_state() const {
  std::vector<torch::optim::OptimizerParamGroup> whole_groups;
  for (const auto& group : param_groups()) whole_groups.emplace_back(group.params(), group.options().clone());
  return remake(*inner_, whole_groups);
}

void ShardedOptimizer::shard_restored() {
  for (size_t g = 0; g < param_groups().size(); ++g) {
    param_groups()[g].options().set_lr(inner_->param_groups().at(g).options().get_lr());
  }
}

void ShardedOptimizer::take_shard(const torch::optim::Optimizer& whole) {
  inner_->state().clear();
  for (size_t i = 0; i < weights_.size(); ++i) {
    const torch::optim::OptimizerParamState* saved = state_of(whole, weights_[i]);
    if (!saved) continue;
    std::unique_ptr<torch::optim::OptimizerParamState> state = saved->clone();
    map_state_tensors(*state, [&](const at::Tensor& t) { return layout_.piece_of(i, t); });
    inner_->state()[pieces_[i].unsafeGetTensorImpl()] = std::move(state);
  }
  for (size_t g = 0; g < param_groups().size(); ++g) {
    param_groups()[g].options().set_lr(whole.param_groups().at(g).options().get_lr());
  }
}

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  if (const auto* sharded = dynamic_cast<const ShardedOptimizer*>(&optimizer)) {
    return optimizer_state_bytes(sharded->inner());
  }
  int64_t bytes = 0;
  for (const auto& [key, state] : optimizer.state()) {
    map_state_tensors(*state->clone(), [&](const at::Tensor& t) {
      bytes += t.numel() * static_cast<int64_t>(t.element_size());
      return t;
    });
  }
  return bytes;
}

}  // namespace conveyor
