#include "plugin/model/tied_parameters.h"

#include "plugin/core/errors.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

namespace conveyor {

namespace {

struct Holder {
  int stage = 0;
  size_t layer = 0;
  std::string name;   // in the Sequential: "3.weight"
  std::string local;  // in the layer: "weight"
  at::Tensor tensor;
};

int stage_of_layer(const StageSplit& plan, size_t layer) {
  for (size_t k = 0; k < plan.stages.size(); ++k) {
    if (static_cast<int64_t>(layer) >= plan.stages[k].begin && static_cast<int64_t>(layer) < plan.stages[k].end) {
      return static_cast<int>(k);
    }
  }
  return -1;
}

std::string describe(const at::Tensor& t) { return c10::str(t.sizes(), " ", t.scalar_type()); }

}  // namespace

std::vector<TiedNames> find_tied_parameters(const std::vector<std::pair<std::string, torch::nn::AnyModule>>& layers,
                                            const StageSplit& plan,
                                            const std::vector<std::vector<std::string>>& declared, bool untie) {
  std::map<std::string, Holder> by_name;
  // Names per tensor in layer order, tensors in order of first appearance:
  // every process of a job numbers the ties alike.
  std::map<const c10::TensorImpl*, std::vector<std::string>> by_tensor;
  std::vector<const c10::TensorImpl*> tensor_order;
  for (size_t i = 0; i < layers.size(); ++i) {
    for (const auto& p : layers[i].second.ptr()->named_parameters()) {
      Holder h{stage_of_layer(plan, i), i, layers[i].first + "." + p.key(), p.key(), p.value()};
      auto& names = by_tensor[p.value().unsafeGetTensorImpl()];
      if (names.empty()) tensor_order.push_back(p.value().unsafeGetTensorImpl());
      names.push_back(h.name);
      by_name.emplace(h.name, std::move(h));
    }
  }

  std::vector<std::vector<std::string>> groups;
  std::map<std::string, size_t> group_of;
  const auto add_to = [&](size_t g, const std::string& name) {
    const auto [it, inserted] = group_of.emplace(name, g);
    if (!inserted && it->second != g) {
      throw std::invalid_argument("conveyor: parameter '" + name + "' is in two groups of tied parameters; " +
                                  "merge them into one");
    }
    if (inserted) groups[g].push_back(name);
  };
  for (size_t g = 0; g < declared.size(); ++g) {
    check_argument(declared[g].size() >= 2, "conveyor: tied_parameters group ", g,
                   " names fewer than two parameters");
    groups.emplace_back();
    for (const auto& name : declared[g]) {
      if (!by_name.count(name)) {
        std::string known;
        for (const auto& [n, h] : by_name) known += (known.empty() ? "" : ", ") + n;
        throw std::invalid_argument("conveyor: tied_parameters names '" + name + "', which is no parameter of the " +
                                    "model (its parameters: " + known + ")");
      }
      add_to(g, name);
    }
  }
  // The same tensor registered in layers of several stages.
  for (const c10::TensorImpl* impl : tensor_order) {
    const auto& names = by_tensor.at(impl);
    std::set<int> stages;
    for (const auto& name : names) stages.insert(by_name.at(name).stage);
    if (stages.size() < 2) continue;
    size_t g = groups.size();
    for (const auto& name : names) {
      if (group_of.count(name)) g = group_of.at(name);
    }
    if (g == groups.size()) groups.emplace_back();
    for (const auto& name : names) add_to(g, name);
  }

  std::vector<TiedNames> ties;
  for (auto& names : groups) {
    std::stable_sort(names.begin(), names.end(),
                     [&](const std::string& a, const std::string& b) { return by_name.at(a).layer < by_name.at(b).layer; });
    const Holder& first = by_name.at(names[0]);
    TiedNames tie;
    for (const auto& name : names) {
      Holder& h = by_name.at(name);
      if (!h.tensor.sizes().equals(first.tensor.sizes()) || h.tensor.scalar_type() != first.tensor.scalar_type()) {
        throw std::invalid_argument("conveyor: tied parameters '" + first.name + "' (" + describe(first.tensor) +
                                    ") and '" + h.name + "' (" + describe(h.tensor) + ") differ in shape or dtype");
      }
      const bool shared_with_earlier_stage =
          h.stage != first.stage && h.tensor.unsafeGetTensorImpl() == first.tensor.unsafeGetTensorImpl();
      if (untie && shared_with_earlier_stage) {
        auto* layer = dynamic_cast<RebindsParameters*>(layers[h.layer].second.ptr().get());
        if (!layer) {
          throw std::invalid_argument(c10::str(
              "conveyor: parameter '", h.name, "' is the same tensor as '", first.name, "', but they are in stages ",
              first.stage, " and ", h.stage, ", and a stage's tensors live on its own device. Give layer ",
              layers[h.layer].first, " a parameter of its own and declare the tie: ",
              "PipelineOptions().tied_parameters({{\"", first.name, "\", \"", h.name,
              "\"}}), or keep both layers in one stage"));
        }
        // Every name of this stage's layers that shares the tensor gets the same copy.
        const at::Tensor copy = h.tensor.detach().clone().requires_grad_(h.tensor.requires_grad());
        for (const auto& other : names) {
          Holder& o = by_name.at(other);
          if (o.stage != h.stage || o.tensor.unsafeGetTensorImpl() != first.tensor.unsafeGetTensorImpl()) continue;
          auto* owner = dynamic_cast<RebindsParameters*>(layers[o.layer].second.ptr().get());
          if (!owner) {
            throw std::invalid_argument(c10::str("conveyor: parameter '", o.name, "' shares a tensor with stage ",
                                                 first.stage, " and its layer cannot be given a copy"));
          }
          owner->rebind_parameter(o.local, copy);
          o.tensor = copy;
        }
      }
      tie.emplace_back(h.stage, h.name);
    }
    std::stable_sort(tie.begin(), tie.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    ties.push_back(std::move(tie));
  }
  return ties;
}

}  // namespace conveyor
