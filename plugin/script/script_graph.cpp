#include "plugin/script/script_graph.h"

#include "plugin/script/forward_graph.h"
#include "plugin/script/script_nodes.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/jit/ir/ir.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <unordered_map>

namespace conveyor {

namespace {

using torch::jit::Block;
using torch::jit::Graph;
using torch::jit::Module;
using torch::jit::Node;
using torch::jit::Value;

void add_module_state(const Module& model, const std::string& path, std::vector<std::string>& state) {
  const Module m = submodule_of(model, path);
  const std::string prefix = path.empty() ? "" : path + ".";
  for (const auto& p : m.named_parameters(/*recurse=*/true)) state.push_back(prefix + p.name);
  for (const auto& b : m.named_buffers(/*recurse=*/true)) state.push_back(prefix + b.name);
}

// The parameters and buffers a segment reads and the submodules it runs.
// `direct` receives the names it reads itself (a GetAttr chain from self),
// `in_calls` those that the code of a module it calls may read.
void collect_state(const Block* block, const Value* self, const Module& model, ScriptSegment& s,
                   std::set<std::string>& direct, std::set<std::string>& in_calls) {
  const auto add_module = [&](const std::string& path) {
    const size_t before = s.state.size();
    add_module_state(model, path, s.state);
    in_calls.insert(s.state.begin() + static_cast<std::ptrdiff_t>(before), s.state.end());
    s.submodules.push_back(path);
  };
  for (const Node* n : block->nodes()) {
    for (const Block* sub : n->blocks()) collect_state(sub, self, model, s, direct, in_calls);
    if (n->kind() != c10::prim::GetAttr) {
      // A method of the model itself may read anything the model holds.
      for (const Value* in : n->inputs()) {
        if (in == self) add_module("");
      }
      continue;
    }
    const auto path = path_of(n->output(), self);
    if (!path) continue;
    const auto cls = n->output()->type()->cast<c10::ClassType>();
    if (cls && cls->is_module()) {
      bool only_attribute_reads = true;
      for (const auto& use : n->output()->uses()) only_attribute_reads &= use.user->kind() == c10::prim::GetAttr;
      if (!only_attribute_reads) add_module(*path);
    } else {
      const Module parent = submodule_of(model, *path_of(n->input(0), self));
      const auto slot = parent.type()->findAttributeSlot(n->s(c10::attr::name));
      if (slot && (parent.type()->is_parameter(*slot) || parent.type()->is_buffer(*slot))) {
        s.state.push_back(*path);
        direct.insert(*path);
      }
    }
  }
}

// `claimed` maps the parameters and buffers of earlier segments to their
// stage, by the first name of their tensor (`first`: a tied weight's other
// names, as GPT-2's lm_head.weight is its transformer.wte.weight): one this
// segment reads directly becomes an input of its own (a tied weight, fed the
// stage's own copy); one it reads through a call is an error.
ScriptSegment make_segment(const ForwardGraph& f, const Module& model, size_t begin, size_t end,
                           const std::vector<Value*>& ins, const std::vector<Value*>& outs, std::string description,
                           const std::map<std::string, size_t>& claimed,
                           const std::map<std::string, std::string>& first, size_t stage) {
  auto g = std::make_shared<Graph>();
  Value* self = g->addInput("self")->setType(f.self->type());
  std::unordered_map<Value*, Value*> env{{f.self, self}};
  for (size_t i = 0; i < ins.size(); ++i) {
    Value* in = g->addInput("x" + std::to_string(i));
    env[ins[i]] = in->setType(is_number(ins[i]) ? c10::TensorType::get() : ins[i]->type());
  }
  for (size_t i = 0; i < ins.size(); ++i) {  // a number arrives as a 0-dim tensor
    if (!is_number(ins[i])) continue;
    const auto kind = ins[i]->type()->kind();
    const c10::Symbol to = kind == c10::TypeKind::IntType     ? c10::aten::Int
                           : kind == c10::TypeKind::FloatType ? c10::aten::Float
                                                              : c10::aten::Bool;
    env[ins[i]] = g->insert(to, {env[ins[i]]});
  }
  std::function<Value*(Value*)> map = [&](Value* v) -> Value* {
    if (auto it = env.find(v); it != env.end()) return it->second;
    Node* n = v->node();
    TORCH_INTERNAL_ASSERT(movable(n, f.self), "conveyor: ", f.describe(v), " crosses into ", description);
    Node* copy = g->insertNode(g->createClone(n, map));
    for (size_t i = 0; i < n->outputs().size(); ++i) env[n->output(i)] = copy->output(i);
    return env.at(v);
  };
  for (size_t i = begin; i < end; ++i) {
    Node* n = f.nodes[i];
    if (movable(n, f.self)) continue;
    Node* copy = g->insertNode(g->createClone(n, map));
    for (size_t j = 0; j < n->outputs().size(); ++j) env[n->output(j)] = copy->output(j);
  }
  // A number leaves as a 0-dim tensor (see is_number).
  const auto sent = [&](Value* out) { return is_number(out) ? g->insert(c10::prim::NumToTensor, {map(out)}) : map(out); };
  if (outs.size() == 1) {
    g->registerOutput(sent(outs[0]));
  } else {
    std::vector<Value*> values;
    for (Value* out : outs) values.push_back(sent(out));
    g->registerOutput(g->insertNode(g->createTuple(values))->output());
  }

  ScriptSegment s;
  s.num_inputs = ins.size();
  s.description = std::move(description);
  std::set<std::string> direct, in_calls;
  collect_state(g->block(), self, model, s, direct, in_calls);
  std::set<std::string> seen;
  std::vector<std::string> unique;
  for (auto& name : s.state) {
    if (seen.insert(name).second) unique.push_back(std::move(name));
  }
  s.state = std::move(unique);
  for (const auto& name : s.state) {
    const auto named = first.find(name);
    const std::string& tensor = named == first.end() ? name : named->second;
    const auto it = claimed.find(tensor);
    if (it == claimed.end()) continue;
    if (in_calls.count(name)) {
      const std::string also = tensor == name ? "" : " (the tensor of '" + tensor + "')";
      throw std::invalid_argument(c10::str(
          "conveyor: '", name, "'", also, " is used by stage ", it->second, " and, inside a submodule it calls, by stage ", stage,
          "; a stage can be given its own copy of a tied weight only where its code reads the weight itself ",
          "(as F.linear(h, self.embed.weight)): choose split points that keep the calls in one stage"));
    }
    Value* fed = g->addInput("tied" + std::to_string(s.fed.size()));
    for (const Node* n : g->nodes()) {
      if (n->kind() == c10::prim::GetAttr && path_of(n->output(), self) == name) fed->setType(n->output()->type());
    }
    feed_attribute(g->block(), self, name, fed);
    s.fed.push_back(name);
  }
  s.function = std::make_shared<torch::jit::GraphFunction>(c10::QualifiedName("conveyor.segment"), g, nullptr);
  return s;
}

}  // namespace

Module submodule_of(const Module& model, const std::string& path) {
  Module m = model;
  std::string at = "the model";
  if (path.empty()) return m;
  for (const auto& part : split_path(path)) {
    if (part.empty() || !m.hasattr(part) || !m.attr(part).isModule()) {
      std::vector<std::string> names;
      for (const auto& child : m.named_children()) names.push_back(child.name);
      throw std::invalid_argument(at + " has no submodule '" + part +
                                  "' (its submodules: " + (names.empty() ? std::string("none") : join(names)) + ")");
    }
    m = m.attr(part).toModule();
    at = "'" + (at == "the model" ? part : at.substr(1, at.size() - 2) + "." + part) + "'";
  }
  return m;
}

std::vector<std::string> chain_of_calls(const Module& model) {
  const ForwardGraph f = forward_graph(model);
  if (f.inputs.size() != 1) {
    std::vector<std::string> names;
    for (const Value* v : f.inputs) names.push_back(v->debugName());
    throw std::invalid_argument(c10::str("conveyor: the model's forward takes ", f.inputs.size(),
                                         " arguments besides self (", join(names), "); without split points a model ",
                                         "is cut only as a plain chain of one argument: give split points (the names ",
                                         "of the submodules whose calls begin new stages) and every value live across ",
                                         "a cut travels"));
  }
  Value* expected = f.inputs[0];
  std::string expected_from = "the input";
  std::set<std::string> seen;
  std::vector<std::string> paths;
  const auto check_single_use = [&](const Node* consumer) {
    for (const auto& use : expected->uses()) {
      if (use.user != consumer) {
        refuse_chain(f, expected_from + " is used again, by " +
                            (use.user == f.graph->return_node() ? std::string("the return") : where(use.user)));
      }
    }
  };
  for (Node* n : f.nodes) {
    if (movable(n, f.self)) continue;
    const auto path = called_path(n, f.self);
    if (!path) refuse_chain(f, "found " + where(n));
    if (n->inputs().size() != 2) {
      refuse_chain(f, c10::str("'", *path, "' is called with ", n->inputs().size() - 1, " arguments"));
    }
    if (n->input(1) != expected) {
      refuse_chain(f, "'" + *path + "' is called on " + f.describe(n->input(1)) + ", not on " + expected_from);
    }
    check_single_use(n);
    if (!seen.insert(*path).second) refuse_chain(f, "'" + *path + "' is called twice");
    paths.push_back(*path);
    expected = n->output();
    expected_from = "the output of '" + *path + "'";
  }
  if (paths.empty()) refuse_chain(f, "it calls no submodule");
  if (f.graph->outputs()[0] != expected) {
    refuse_chain(f, "it returns " + f.describe(f.graph->outputs()[0]) + ", not " + expected_from);
  }
  check_single_use(f.graph->return_node());
  return paths;
}

std::vector<ScriptSegment> cut_forward(const Module& model, const std::vector<std::string>& split_points) {
  ForwardGraph f = forward_graph(model);
  inline_own_methods(f, model);
  for (size_t i = 0; i < split_points.size(); ++i) {
    const std::string& sp = split_points[i];
    try {
      if (sp.empty()) throw std::invalid_argument("the name is empty");
      submodule_of(model, sp);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(
          c10::str("conveyor: split point ", i, " ('", sp, "') names no submodule of the model: ", e.what()));
    }
    const auto parts = split_path(sp);
    std::string parent;
    // No parent to inline where the forward calls the split point itself, as a
    // loop over a ModuleList or Sequential unrolls into calls of "layers.0", ...
    for (size_t d = 0; d + 1 < parts.size() && f.calls_of(sp).empty(); ++d) {
      parent += (d ? "." : "") + parts[d];
      inline_call(f, model, parent, sp);
    }
  }

  const size_t first_work = f.first_work();
  std::vector<size_t> cuts;
  std::vector<std::vector<Value*>> crossing;
  for (size_t i = 0; i < split_points.size(); ++i) {
    const std::string& sp = split_points[i];
    const std::vector<size_t> at = f.calls_of(sp);
    if (at.size() != 1) {
      throw std::invalid_argument(c10::str("conveyor: split point '", sp, "' is called ", at.size(),
                                           " times at the top level of the forward being cut; a split point must be ",
                                           "called exactly once, outside any branch or loop"));
    }
    if (i > 0 && at[0] <= cuts.back()) {
      throw std::invalid_argument("conveyor: split points out of order: '" + sp + "' is called before '" +
                                  split_points[i - 1] +
                                  "' in the model's forward; list split points in the order "
                                  "the forward calls them");
    }
    if (at[0] <= first_work) {
      throw std::invalid_argument("conveyor: split point '" + sp +
                                  "' is the first thing the forward does, so stage 0 "
                                  "would be empty; the first stage begins at the input by itself");
    }
    const auto live = f.live_at(at[0]);
    for (const Value* v : live) {
      if (!travels(v)) {
        throw std::invalid_argument("conveyor: split point '" + sp + "': " + f.describe(v) +
                                    " is made before the cut and used after it, but only tensors and numbers " +
                                    "travel between stages; compute it after the cut, or make it a tensor (" +
                                    possible_split_points(f) + ")");
      }
    }
    cuts.push_back(at[0]);
    crossing.push_back(live);
  }

  std::vector<ScriptSegment> segments;
  std::map<std::string, size_t> stage_of;
  // Every name of a parameter or buffer -> the first name of its tensor.
  std::map<std::string, std::string> first;
  std::map<const c10::TensorImpl*, std::string> by_tensor;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) {
    first[p.name] = by_tensor.emplace(p.value.unsafeGetTensorImpl(), p.name).first->second;
  }
  for (const auto& b : model.named_buffers(/*recurse=*/true)) {
    first[b.name] = by_tensor.emplace(b.value.unsafeGetTensorImpl(), b.name).first->second;
  }
  const size_t n = split_points.size();
  for (size_t k = 0; k <= n; ++k) {
    const size_t begin = k == 0 ? 0 : cuts[k - 1];
    const size_t end = k == n ? f.nodes.size() : cuts[k];
    const std::vector<Value*>& in = k == 0 ? f.inputs : crossing[k - 1];
    const std::vector<Value*> out = k == n ? std::vector<Value*>{f.graph->outputs()[0]} : crossing[k];
    const std::string description =
        k == 0   ? "the forward up to '" + split_points[0] + "'"
        : k == n ? "the forward from '" + split_points[k - 1] + "' on"
                 : "the forward from '" + split_points[k - 1] + "' up to '" + split_points[k] + "'";
    segments.push_back(make_segment(f, model, begin, end, in, out, description, stage_of, first, k));
    for (const auto& name : segments.back().state) stage_of.emplace(first.count(name) ? first.at(name) : name, k);
  }
  return segments;
}

}  // namespace conveyor
