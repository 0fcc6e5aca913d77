#include "ops/swap.h"

#include "ops/adapters.h"

#include <torch/csrc/jit/api/function_impl.h>

#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <map>
#include <mutex>
#include <sstream>

namespace conveyor {
namespace {

using torch::nn::Module;

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// A registry filled by static initializers in the ops' files.
template <typename Swapper>
class SwapperTable {
 public:
  static SwapperTable& get() {
    static SwapperTable table;  // built on first use, so registration order across files does not matter
    return table;
  }
  void add(Swapper swapper) {
    const std::lock_guard<std::mutex> lock(mutex_);
    swappers_.push_back(std::move(swapper));
  }
  std::vector<Swapper> all() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return swappers_;
  }

 private:
  std::mutex mutex_;
  std::vector<Swapper> swappers_;
};

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
  SwapperTable<FusedSwapper>::get().add(std::move(swapper));
}

std::vector<FusedSwapper> fused_swappers() { return SwapperTable<FusedSwapper>::get().all(); }

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

// --- TorchScript --------------------------------------------------------------

namespace {

void collect_nodes(torch::jit::Block* block, std::vector<torch::jit::Node*>& nodes) {
  for (torch::jit::Node* node : block->nodes()) {
    nodes.push_back(node);
    for (torch::jit::Block* inner : node->blocks()) collect_nodes(inner, nodes);
  }
}

// Puts a call of `to` with the same inputs in place of `node`.
void replace_call(torch::jit::Node* node, const c10::Symbol& to) {
  torch::jit::Graph* graph = node->owningGraph();
  const torch::jit::WithInsertPoint insert_before(node);
  torch::jit::Node* call = graph->insertNode(graph->create(to, node->inputs(), node->outputs().size()));
  call->setSourceRange(node->sourceRange());
  for (size_t i = 0; i < node->outputs().size(); ++i) {
    call->output(i)->setType(node->output(i)->type());
    node->output(i)->replaceAllUsesWith(call->output(i));
  }
  node->destroy();
}

// What was found in one class type's code: per swapper, swapped or why not.
using TypeFindings = std::vector<std::pair<std::string, std::optional<std::string>>>;

TypeFindings swap_in_type(const torch::jit::Module& module, const std::vector<ScriptSwapper>& swappers) {
  TypeFindings findings;
  for (const torch::jit::Method& method : module.get_methods()) {
    torch::jit::GraphFunction* function = torch::jit::tryToGraphFunction(method.function());
    if (function == nullptr) continue;
    std::vector<torch::jit::Node*> nodes;
    collect_nodes(function->graph()->block(), nodes);
    for (torch::jit::Node* node : nodes) {
      for (const ScriptSwapper& swapper : swappers) {
        if (!swapper.matches(*node)) continue;
        std::optional<std::string> why_not = swapper.why_not ? swapper.why_not(*node, module) : std::nullopt;
        if (!why_not) replace_call(node, c10::Symbol::fromQualString(swapper.to));
        findings.emplace_back(swapper.kind, std::move(why_not));
        break;
      }
    }
  }
  return findings;
}

}  // namespace

void register_script_swapper(ScriptSwapper swapper) {
  TORCH_CHECK(swapper.matches && !swapper.to.empty(), "register_script_swapper: swapper '", swapper.kind,
              "' lacks matches or a replacement op");
  SwapperTable<ScriptSwapper>::get().add(std::move(swapper));
}

std::vector<ScriptSwapper> script_swappers() { return SwapperTable<ScriptSwapper>::get().all(); }

SwapReport swap_fused_ops(torch::jit::Module& module) {
  const std::vector<ScriptSwapper> swappers = script_swappers();
  // The clone has types of its own (shared among its modules as the
  // original's are), so editing their code leaves the original's alone, and
  // no executor has compiled the old code yet.
  torch::jit::Module swapped = module.clone(/*inplace=*/true);
  std::map<const c10::ClassType*, TypeFindings> by_type;
  SwapReport report;
  for (const auto& item : swapped.named_modules()) {
    const c10::ClassType* type = item.value.type().get();
    if (!by_type.count(type)) by_type[type] = swap_in_type(item.value, swappers);
    for (const auto& [kind, why_not] : by_type[type]) {
      if (why_not) {
        report.skipped.push_back({item.name, *why_not});
      } else {
        report.swapped.push_back({item.name, kind});
      }
    }
  }
  module = swapped;
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
