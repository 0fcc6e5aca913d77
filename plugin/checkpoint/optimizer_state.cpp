#include "plugin/checkpoint/optimizer_state.h"

#include "plugin/checkpoint/checked_ivalue.h"
#include "plugin/checkpoint/checkpoint_values.h"
#include "plugin/core/errors.h"

#include <ATen/Dispatch.h>
#include <c10/util/StringUtil.h>
#include <torch/optim.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

namespace conveyor {

namespace {

using namespace checkpoint_values;


std::string optimizer_type(const torch::optim::Optimizer& opt) {
  if (dynamic_cast<const torch::optim::SGD*>(&opt)) return "SGD";
  if (dynamic_cast<const torch::optim::Adam*>(&opt)) return "Adam";
  if (dynamic_cast<const torch::optim::AdamW*>(&opt)) return "AdamW";
  if (dynamic_cast<const torch::optim::Adagrad*>(&opt)) return "Adagrad";
  if (dynamic_cast<const torch::optim::RMSprop*>(&opt)) return "RMSprop";
  throw std::invalid_argument(
      "conveyor: checkpoints hold the state of SGD, Adam, AdamW, Adagrad and RMSprop "
      "optimizers only; this optimizer is none of them");
}

// One parameter's state as {field: tensor or int}; undefined tensors are left out.
Dict param_state_to_dict(const std::string& type, torch::optim::OptimizerParamState& s) {
  Dict d = new_dict();
  const auto put = [&](const char* name, const at::Tensor& t) {
    if (t.defined()) d.insert(name, to_cpu(t));
  };
  if (type == "SGD") {
    put("momentum_buffer", static_cast<torch::optim::SGDParamState&>(s).momentum_buffer());
  } else if (type == "Adam" || type == "AdamW") {
    // AdamParamState and AdamWParamState have the same fields.
    const auto fill = [&](auto& st) {
      d.insert("step", st.step());
      put("exp_avg", st.exp_avg());
      put("exp_avg_sq", st.exp_avg_sq());
      put("max_exp_avg_sq", st.max_exp_avg_sq());
    };
    if (type == "Adam")
      fill(static_cast<torch::optim::AdamParamState&>(s));
    else
      fill(static_cast<torch::optim::AdamWParamState&>(s));
  } else if (type == "Adagrad") {
    auto& st = static_cast<torch::optim::AdagradParamState&>(s);
    d.insert("step", st.step());
    put("sum", st.sum());
  } else if (type == "RMSprop") {
    auto& st = static_cast<torch::optim::RMSpropParamState&>(s);
    d.insert("step", st.step());
    put("square_avg", st.square_avg());
    put("momentum_buffer", st.momentum_buffer());
    put("grad_avg", st.grad_avg());
  }
  return d;
}

// Whether the optimizer's step reads the field (it fails on a state without it).
bool needs(const std::string& type, const torch::optim::OptimizerOptions& options, const std::string& field) {
  if (type == "SGD") return static_cast<const torch::optim::SGDOptions&>(options).momentum() != 0;
  if (type == "Adam" || type == "AdamW") {
    const bool amsgrad = type == "Adam" ? static_cast<const torch::optim::AdamOptions&>(options).amsgrad()
                                        : static_cast<const torch::optim::AdamWOptions&>(options).amsgrad();
    return field != "max_exp_avg_sq" || amsgrad;
  }
  if (type == "Adagrad") return true;
  const auto& rms = static_cast<const torch::optim::RMSpropOptions&>(options);
  return field == "square_avg" || (field == "momentum_buffer" && rms.momentum() > 0) ||
         (field == "grad_avg" && rms.centered());
}

// The state of `param` from its saved dict, every field checked (its type, a
// tensor's shape against the parameter's, the fields the optimizer's step
// reads all there); nothing is installed yet.
std::unique_ptr<torch::optim::OptimizerParamState> param_state_from_dict(
    const std::string& type, const torch::optim::OptimizerOptions& options, const Dict& d, const at::Tensor& param,
    const std::string& what) {
  const auto tensor = [&](const char* name) {
    if (!checked::has(d, name)) {
      if (needs(type, options, name)) throw std::invalid_argument(what + "'" + name + "' is missing");
      return at::Tensor();
    }
    const at::Tensor saved = checked::tensor_field(d, name, what);
    check_argument(saved.sizes().equals(param.sizes()), what, "'", name, "' has shape ", saved.sizes(),
                   ", its parameter ", param.sizes());
    // Its own contiguous memory: the optimizer updates it in place.
    return saved.to(param.device(), param.scalar_type()).clone(at::MemoryFormat::Contiguous);
  };
  const auto step = [&]() {
    const int64_t n = checked::has(d, "step") ? checked::int_field(d, "step", what) : int64_t{0};
    if (n < 0) throw std::invalid_argument(what + "'step' is negative");
    // The step counts on from it, and Adam raises its betas to that power as a double.
    if (n > (int64_t{1} << 53)) throw std::invalid_argument(what + "'step' is " + std::to_string(n) + ", past 2^53");
    return n;
  };
  if (type == "SGD") {
    auto st = std::make_unique<torch::optim::SGDParamState>();
    st->momentum_buffer(tensor("momentum_buffer"));
    return st;
  }
  if (type == "Adam" || type == "AdamW") {
    const auto fill = [&](auto st) -> std::unique_ptr<torch::optim::OptimizerParamState> {
      st->step(step());
      st->exp_avg(tensor("exp_avg"));
      st->exp_avg_sq(tensor("exp_avg_sq"));
      st->max_exp_avg_sq(tensor("max_exp_avg_sq"));
      return st;
    };
    if (type == "Adam") return fill(std::make_unique<torch::optim::AdamParamState>());
    return fill(std::make_unique<torch::optim::AdamWParamState>());
  }
  if (type == "Adagrad") {
    auto st = std::make_unique<torch::optim::AdagradParamState>();
    st->step(step());
    st->sum(tensor("sum"));
    return st;
  }
  auto st = std::make_unique<torch::optim::RMSpropParamState>();
  st->step(step());
  st->square_avg(tensor("square_avg"));
  st->momentum_buffer(tensor("momentum_buffer"));
  st->grad_avg(tensor("grad_avg"));
  return st;
}

// The largest factor the optimizer's step multiplies a parameter by or adds
// to it, as a scalar of the parameter's type: the learning rate, Adam's over
// its first bias correction at the first step (1 - beta1), AdamW's decay
// factor 1 - lr * weight_decay. Adagrad's decayed rate is at most the rate.
double largest_step_scalar(const std::string& type, const torch::optim::OptimizerOptions& options, double lr) {
  const auto adam = [&](double beta1, double decay) {
    return std::max(beta1 < 1 ? lr / (1 - beta1) : lr, std::abs(1 - lr * decay));
  };
  if (type == "Adam") {
    const auto& o = static_cast<const torch::optim::AdamOptions&>(options);
    return adam(std::get<0>(o.betas()), 0);
  }
  if (type == "AdamW") {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(options);
    return adam(std::get<0>(o.betas()), o.weight_decay());
  }
  return lr;
}

// A saved learning rate the optimizer can step with: finite, not negative,
// and its step's scalars representable in every parameter's type (a float
// parameter's step fails on an lr of 1e39 with an error of LibTorch's own).
double checked_learning_rate(const std::string& type, const torch::optim::OptimizerOptions& options,
                             const std::vector<at::Tensor>& params, double lr, const std::string& what) {
  check_argument(std::isfinite(lr) && lr >= 0, what, "'lr' is ", lr, ", not a finite rate of 0 or more");
  const double scalar = largest_step_scalar(type, options, lr);
  for (const auto& p : params) {
    if (!at::isFloatingType(p.scalar_type())) continue;
    double largest = 0;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p.scalar_type(), "checked_learning_rate", [&] {
      largest = static_cast<double>(std::numeric_limits<scalar_t>::max());
    });
    check_argument(std::isfinite(scalar) && scalar <= largest, what, "'lr' is ", lr, ": its optimizer's step would ",
                   "scale by ", scalar, ", more than a ", p.scalar_type(), " parameter holds");
  }
  return lr;
}

}  // namespace

Dict optimizer_state_to_dict(torch::optim::Optimizer& opt, const ParameterNamer& name_of) {
  const std::string type = optimizer_type(opt);
  Dict d = new_dict();
  d.insert("type", type);
  d.insert("stage", int64_t{-1});
  List groups = new_list();
  Dict state = new_dict();
  for (auto& group : opt.param_groups()) {
    Dict g = new_dict();
    g.insert("lr", group.options().get_lr());
    List params = new_list();
    for (const auto& p : group.params()) {
      const std::string name = name_of(p);
      params.push_back(name);
      const auto it = opt.state().find(p.unsafeGetTensorImpl());
      if (it != opt.state().end()) state.insert(name, param_state_to_dict(type, *it->second));
    }
    g.insert("params", params);
    groups.push_back(g);
  }
  d.insert("param_groups", groups);
  d.insert("state", state);
  return d;
}

std::function<void()> optimizer_state_restorer(torch::optim::Optimizer& opt, const Dict& saved,
                                               const ParameterNamer& name_of, const std::string& what) {
  const std::string type = optimizer_type(opt);
  const std::string saved_type = checked::to_string(checked::field(saved, "type", what), "type", what);
  if (type != saved_type) {
    throw std::invalid_argument(what + "the saved state is of " + saved_type + ", this optimizer is " + type);
  }
  const List groups = checked::list_field(saved, "param_groups", what);
  check_argument(groups.size() == opt.param_groups().size(), what, "the saved state has ", groups.size(),
                 " parameter groups, this optimizer ", opt.param_groups().size());
  const Dict state = checked::dict_field(saved, "state", what);
  // Everything is read and checked here; the function returned only installs it.
  std::vector<double> lrs;
  std::vector<std::pair<at::TensorImpl*, std::shared_ptr<torch::optim::OptimizerParamState>>> states;
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string group_name = c10::str("param_groups[", g, "]");
    const Dict group = checked::to_dict(groups.get(g), group_name, what);
    const List saved_params = checked::list_field(group, "params", what);
    const auto& params = opt.param_groups()[g].params();
    bool same = saved_params.size() == params.size();
    for (size_t i = 0; same && i < params.size(); ++i) {
      same = checked::to_string(saved_params.get(i), group_name + ".params", what) == name_of(params[i]);
    }
    check_argument(same, what, "parameter group ", g, " holds other parameters than the saved one");
    const auto& options = opt.param_groups()[g].options();
    lrs.push_back(checked_learning_rate(
        type, options, params, checked::to_double(checked::field(group, "lr", what), "lr", what), what));
    for (const auto& p : params) {
      const std::string name = name_of(p);
      if (!checked::has(state, name)) continue;
      const Dict fields = checked::dict_field(state, name, what);
      states.emplace_back(p.unsafeGetTensorImpl(),
                          param_state_from_dict(type, options, fields, p, what + "'" + name + "': "));
    }
  }
  return [&opt, lrs, states]() {
    opt.state().clear();
    for (size_t g = 0; g < lrs.size(); ++g) opt.param_groups()[g].options().set_lr(lrs[g]);
    for (const auto& [impl, s] : states) opt.state()[impl] = s->clone();
  };
}

}  // namespace conveyor
