#include "plugin/runtime/step_rollback.h"

#include <torch/serialize/archive.h>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <sstream>

namespace conveyor {

namespace {

// A copy of a tensor the optimizer's step changes in place (undefined stays so).
at::Tensor copied(const at::Tensor& t) { return t.defined() ? t.detach().clone() : t; }

// The optimizers whose state deep_copy knows: LibTorch's with state.
bool copyable(const torch::optim::Optimizer& opt) {
  using namespace torch::optim;
  return dynamic_cast<const SGD*>(&opt) || dynamic_cast<const Adam*>(&opt) || dynamic_cast<const AdamW*>(&opt) ||
         dynamic_cast<const Adagrad*>(&opt) || dynamic_cast<const RMSprop*>(&opt);
}

// The state of one parameter of a copyable() optimizer, its tensors copied.
std::unique_ptr<torch::optim::OptimizerParamState> deep_copy(const torch::optim::Optimizer& opt,
                                                              const torch::optim::OptimizerParamState& s) {
  using namespace torch::optim;
  if (dynamic_cast<const SGD*>(&opt)) {
    auto c = std::make_unique<SGDParamState>(static_cast<const SGDParamState&>(s));
    c->momentum_buffer(copied(c->momentum_buffer()));
    return c;
  }
  const auto adam = [](auto c) -> std::unique_ptr<OptimizerParamState> {
    c->exp_avg(copied(c->exp_avg()));
    c->exp_avg_sq(copied(c->exp_avg_sq()));
    c->max_exp_avg_sq(copied(c->max_exp_avg_sq()));
    return c;
  };
  if (dynamic_cast<const Adam*>(&opt)) {
    return adam(std::make_unique<AdamParamState>(static_cast<const AdamParamState&>(s)));
  }
  if (dynamic_cast<const AdamW*>(&opt)) {
    return adam(std::make_unique<AdamWParamState>(static_cast<const AdamWParamState&>(s)));
  }
  if (dynamic_cast<const Adagrad*>(&opt)) {
    auto c = std::make_unique<AdagradParamState>(static_cast<const AdagradParamState&>(s));
    c->sum(copied(c->sum()));
    return c;
  }
  auto c = std::make_unique<RMSpropParamState>(static_cast<const RMSpropParamState&>(s));
  c->square_avg(copied(c->square_avg()));
  c->momentum_buffer(copied(c->momentum_buffer()));
  c->grad_avg(copied(c->grad_avg()));
  return c;
}

}  // namespace

std::shared_ptr<const WeightVersion> StepRollback::keep(Stage& stage) {
  Saved saved;
  saved.stage = &stage;
  saved.weights = stage.snapshot();
  saved.updates = stage.updates();
  if (torch::optim::Optimizer* opt = stage.optimizer()) {
    if (copyable(*opt)) {  // a copy in memory, not a serialized archive, at every step
      saved.copied = true;
      for (const auto& [impl, state] : opt->state()) saved.state.emplace_back(impl, deep_copy(*opt, *state));
      for (const auto& group : opt->param_groups()) saved.lrs.push_back(group.options().get_lr());
    } else {
      torch::serialize::OutputArchive archive;
      opt->save(archive);
      std::ostringstream out;
      archive.save_to(out);
      saved.optimizer = out.str();
    }
  }
  saved_.push_back(std::move(saved));
  return saved_.back().weights;
}

void StepRollback::keep_random(Stage& stage) {
  if (StageRandom* random = stage.random()) random_.emplace_back(random, random->state());
}

void StepRollback::restore() {
  for (const auto& [random, state] : random_) random->set_state(state);
  for (const Saved& saved : saved_) {
    saved.stage->restore_live(*saved.weights);
    saved.stage->restore_updates(saved.updates);
    torch::optim::Optimizer* opt = saved.stage->optimizer();
    if (!saved.optimizer.empty()) {
      torch::serialize::InputArchive archive;
      std::istringstream in(saved.optimizer);
      archive.load_from(in);
      opt->load(archive);
    } else if (saved.copied) {
      opt->state().clear();
      for (const auto& [impl, state] : saved.state) opt->state()[impl] = deep_copy(*opt, *state);  // restorable again
      for (size_t g = 0; g < saved.lrs.size(); ++g) opt->param_groups()[g].options().set_lr(saved.lrs[g]);
    }
  }
}

}  // namespace conveyor
