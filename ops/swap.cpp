#include "ops/swap.h"

#include "plugin/adapters.h"

#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <mutex>
#include <sstream>

namespace conveyor {
namespace {

using torch::nn::Module;

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

struct SwapperTable {
  std::mutex mutex;
  std::vector<FusedSwapper> swappers;
};

SwapperTable& swapper_table() {
  static SwapperTable table;  // built on first use, so registration order across files does not matter
  return table;
}

std::optional<FusedSwapper> find_swapper(const std::vector<FusedSwapper>& swappers, const Module& module) {
  for (const auto& swapper : swappers) {
    if (swapper.matches(module)) return swapper;
  }
  return std::nullopt;
}

// Parents that keep their children by name only (plus, for Sequential, an
// AnyModule list that we update too), so no stale handle survives a swap.
bool holds_children_by_name_only(Module& parent) {
  return dynamic_cast<torch::nn::SequentialImpl*>(&parent) != nullptr ||
         dynamic_cast<torch::nn::ModuleListImpl*>(&parent) != nullptr ||
         dynamic_cast<torch::nn::ModuleDictImpl*>(&parent) != nullptr ||
         dynamic_cast<WrapsInnerModule*>(&parent) != nullptr;
}

void replace_child(Module& parent, const std::string& name, const std::shared_ptr<Module>& old_child,
                   const torch::nn::AnyModule& replacement) {
  if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&parent)) {
    // Sequential::forward runs its AnyModule entries, not the registry, and
    // has no setter: the entry is assigned through its (mutable) iterator.
    for (auto it = seq->begin(); it != seq->end(); ++it) {
      if (it->ptr() == old_child) {
        *it = replacement;
        seq->replace_module(name, replacement.ptr());
        return;
      }
    }
    TORCH_CHECK(false, "swap_fused_ops: child ", name, " is registered in the Sequential but not among its entries");
  }
  if (auto* list = dynamic_cast<torch::nn::ModuleListImpl*>(&parent)) {
    for (auto it = list->begin(); it != list->end(); ++it) {
      if (*it == old_child) {
        *it = replacement.ptr();
        list->replace_module(name, replacement.ptr());
        return;
      }
    }
    TORCH_CHECK(false, "swap_fused_ops: child ", name, " is registered in the ModuleList but not among its entries");
  }
  if (auto* dict = dynamic_cast<torch::nn::ModuleDictImpl*>(&parent)) {
    // update() with an existing key replaces both the entry and the registration.
    dict->update(std::vector<std::pair<std::string, std::shared_ptr<Module>>>{{name, replacement.ptr()}});
    return;
  }
  auto* wrapper = dynamic_cast<WrapsInnerModule*>(&parent);
  TORCH_CHECK(wrapper != nullptr && wrapper->inner() == old_child, "swap_fused_ops: cannot replace child ", name,
              " of ", parent.name());
  wrapper->replace_inner(replacement);
}

void swap_children(const std::vector<FusedSwapper>& swappers, Module& parent, const std::string& prefix,
                   SwapReport& report) {
  for (const auto& item : parent.named_children()) {
    const std::string path = join(prefix, item.key());
    const std::shared_ptr<Module>& child = item.value();
    const std::optional<FusedSwapper> swapper = find_swapper(swappers, *child);
    if (!swapper) {
      swap_children(swappers, *child, path, report);
      continue;
    }
    std::string why_not;
    const std::optional<torch::nn::AnyModule> replacement = swapper->make_replacement(child, &why_not);
    if (!replacement) {
      report.skipped.push_back({path, why_not});
      continue;
    }
    if (!holds_children_by_name_only(parent)) {
      report.skipped.push_back(
          {path, "parent keeps a typed member: " + parent.name() +
                     " may hold this child in a field that Module::replace_module cannot update; keep it in a "
                     "Sequential, ModuleList, ModuleDict or FirstOutput, or replace it by hand"});
      continue;
    }
    replace_child(parent, item.key(), child, *replacement);
    report.swapped.push_back({path, swapper->kind});
  }
}

}  // namespace

void register_fused_swapper(FusedSwapper swapper) {
  TORCH_CHECK(swapper.matches && swapper.make_replacement, "register_fused_swapper: swapper '", swapper.kind,
              "' lacks matches or make_replacement");
  SwapperTable& table = swapper_table();
  const std::lock_guard<std::mutex> lock(table.mutex);
  table.swappers.push_back(std::move(swapper));
}

std::vector<FusedSwapper> fused_swappers() {
  SwapperTable& table = swapper_table();
  const std::lock_guard<std::mutex> lock(table.mutex);
  return table.swappers;
}

SwapReport swap_fused_ops(std::shared_ptr<Module> root) {
  TORCH_CHECK(root != nullptr, "swap_fused_ops: root module is null");
  const std::vector<FusedSwapper> swappers = fused_swappers();
  SwapReport report;
  if (find_swapper(swappers, *root)) {
    report.skipped.push_back({"", "the root module itself: swap_fused_ops replaces children only"});
    return report;
  }
  swap_children(swappers, *root, "", report);
  return report;
}

std::vector<std::string> SwapReport::swapped_paths() const {
  std::vector<std::string> paths;
  for (const auto& s : swapped) paths.push_back(s.path);
  return paths;
}

std::optional<std::string> SwapReport::skip_reason(const std::string& path) const {
  for (const auto& s : skipped) {
    if (s.path == path) return s.reason;
  }
  return std::nullopt;
}

std::string SwapReport::to_string() const {
  std::ostringstream out;
  out << "swapped " << swapped.size() << ", skipped " << skipped.size() << "\n";
  for (const auto& s : swapped) out << "  swapped " << s.path << " (" << s.kind << ")\n";
  for (const auto& s : skipped) out << "  skipped " << (s.path.empty() ? "<root>" : s.path) << ": " << s.reason << "\n";
  return out.str();
}

}  // namespace conveyor
