#pragma once
// A TorchScript model's forward graph as the graph cutting (script_graph.cpp)
// works on it: a private copy, its top-level nodes in order, what is live
// at each, and the calls it inlines so that split points inside them can be
// named.

#include "plugin/script/script_nodes.h"

#include <c10/util/StringUtil.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/ir.h>

#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace conveyor {

// A private copy of the forward graph and its top-level nodes in order.
struct ForwardGraph {
  using Graph = torch::jit::Graph;
  using Node = torch::jit::Node;
  using Value = torch::jit::Value;

  std::shared_ptr<Graph> graph;
  Value* self = nullptr;
  std::vector<Value*> inputs;  // the forward's arguments besides self
  std::vector<Node*> nodes;
  std::unordered_map<const Node*, size_t> index;
  std::set<std::string> inlined;

  void refresh() {
    nodes.assign(graph->nodes().begin(), graph->nodes().end());
    index.clear();
    for (size_t i = 0; i < nodes.size(); ++i) index[nodes[i]] = i;
  }
  // Position of the top-level node that contains `n` (the return: past the end).
  size_t position(const Node* n) const {
    while (n->owningBlock() != graph->block()) n = n->owningBlock()->owningNode();
    return n == graph->return_node() ? nodes.size() : index.at(n);
  }
  // Positions of the top-level calls of the submodule at `path`.
  std::vector<size_t> calls_of(const std::string& path) const {
    std::vector<size_t> at;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (called_path(nodes[i], self) == path) at.push_back(i);
    }
    return at;
  }
  size_t first_work() const {
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (!movable(nodes[i], self)) return i;
    }
    return nodes.size();
  }
  // Values made before `cut` and used at or after it.
  std::vector<Value*> live_at(size_t cut) const {
    std::vector<Value*> live;
    const auto crosses = [&](const Value* v) {
      for (const auto& use : v->uses()) {
        if (position(use.user) >= cut) return true;
      }
      return false;
    };
    for (Value* input : inputs) {
      if (crosses(input)) live.push_back(input);
    }
    for (size_t i = 0; i < cut && i < nodes.size(); ++i) {
      if (movable(nodes[i], self)) continue;
      for (Value* out : nodes[i]->outputs()) {
        if (crosses(out)) live.push_back(out);
      }
    }
    return live;
  }
  std::string describe(const Value* v) const {
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (v == inputs[i]) return c10::str("%", v->debugName(), " (argument ", i + 1, " of the forward)");
    }
    return "%" + v->debugName() + " (" + v->type()->repr_str() + ") from " + where(v->node());
  }
};

// The forward of `model`, whose arguments besides self must be tensors.
ForwardGraph forward_graph(const torch::jit::Module& model);

// Top-level calls before which only tensors and numbers are live: where a
// cut works, as text for messages.
std::string possible_split_points(const ForwardGraph& f);

// Throws the refusal of a forward that is no plain chain of submodule calls.
[[noreturn]] void refuse_chain(const ForwardGraph& f, const std::string& found);

// Inlines the one top-level call of the submodule at `path` (a split point
// lies inside it); throws std::invalid_argument where it is called other
// than once.
void inline_call(ForwardGraph& f, const torch::jit::Module& model, const std::string& path,
                 const std::string& split_point);

// Inlines the calls the forward makes to the model's own methods
// (self._forward_impl(x), as torchvision's models do), so that the calls of
// submodules inside them are top-level calls that split points can name.
void inline_own_methods(ForwardGraph& f, const torch::jit::Module& model);

}  // namespace conveyor
