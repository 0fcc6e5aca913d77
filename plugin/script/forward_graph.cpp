#include "plugin/script/forward_graph.h"

#include "plugin/script/script_graph.h"
#include "plugin/script/script_nodes.h"

#include <c10/util/StringUtil.h>
#include <torch/csrc/jit/ir/ir.h>

#include <algorithm>
#include <stdexcept>

namespace conveyor {

using torch::jit::Module;
using torch::jit::Node;
using torch::jit::Value;

ForwardGraph forward_graph(const Module& model) {
  if (!model.find_method("forward"))
    throw std::invalid_argument("conveyor: the TorchScript model has no forward method");
  ForwardGraph f;
  f.graph = model.get_method("forward").graph()->copy();
  const auto inputs = f.graph->inputs();
  if (inputs.size() < 2) throw std::invalid_argument("conveyor: the model's forward takes no argument besides self");
  f.self = inputs[0];
  for (size_t i = 1; i < inputs.size(); ++i) {
    if (!inputs[i]->type()->isSubtypeOf(*c10::TensorType::get())) {
      throw std::invalid_argument(c10::str("conveyor: argument ", i, " ('", inputs[i]->debugName(),
                                           "') of the model's forward is a ", inputs[i]->type()->repr_str(),
                                           ", but a pipeline feeds a model tensors only"));
    }
    f.inputs.push_back(inputs[i]);
  }
  f.refresh();
  return f;
}

std::string possible_split_points(const ForwardGraph& f) {
  std::vector<std::string> names;
  for (size_t i = f.first_work() + 1; i < f.nodes.size(); ++i) {
    const auto path = called_path(f.nodes[i], f.self);
    const auto live = f.live_at(i);
    if (path && std::all_of(live.begin(), live.end(), travels)) names.push_back(*path);
  }
  if (names.empty()) return "no top-level submodule call works as a split point here; name nested submodules instead";
  return "split points that work here: " + join(names);
}

[[noreturn]] void refuse_chain(const ForwardGraph& f, const std::string& found) {
  throw std::invalid_argument(
      "conveyor: the model's forward is not a plain chain of submodule calls, so it cannot be cut into layers by "
      "itself: " +
      found +
      ". Give split points instead: the names of the submodules whose calls begin new stages, "
      "with only tensors crossing each cut (" +
      possible_split_points(f) + ")");
}

void inline_call(ForwardGraph& f, const Module& model, const std::string& path, const std::string& split_point) {
  if (f.inlined.count(path)) return;
  f.refresh();
  const std::vector<size_t> calls = f.calls_of(path);
  if (calls.size() != 1) {
    throw std::invalid_argument(c10::str("conveyor: split point '", split_point, "' lies inside '", path,
                                         "', which the forward calls ", calls.size(), " times at top level; a cut ",
                                         "inside a submodule needs it called exactly once, outside any branch or ",
                                         "loop"));
  }
  Node* call = f.nodes[calls[0]];
  // The overload called (forward__0, ...) where the forward has several.
  const auto callee = submodule_of(model, path).get_method(call->s(c10::attr::name)).graph();
  torch::jit::WithInsertPoint guard(call);
  const auto outputs = torch::jit::insertGraph(*f.graph, *callee, call->inputs());
  call->output()->replaceAllUsesWith(outputs.at(0));
  call->destroy();
  f.inlined.insert(path);
  f.refresh();
}

void inline_own_methods(ForwardGraph& f, const Module& model) {
  for (bool again = true; again;) {
    again = false;
    f.refresh();
    for (Node* call : f.nodes) {
      if (call->kind() != c10::prim::CallMethod || call->input(0) != f.self) continue;
      const auto callee = model.get_method(call->s(c10::attr::name)).graph();
      torch::jit::WithInsertPoint guard(call);
      const auto outputs = torch::jit::insertGraph(*f.graph, *callee, call->inputs());
      call->output()->replaceAllUsesWith(outputs.at(0));
      call->destroy();
      again = true;
      break;
    }
  }
  f.refresh();
}

}  // namespace conveyor
