#include "plugin/script/script_nodes.h"

#include <sstream>

namespace conveyor {

using torch::jit::Block;
using torch::jit::Node;
using torch::jit::Value;

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::istringstream in(path);
  for (std::string part; std::getline(in, part, '.');) parts.push_back(part);
  return parts;
}

std::string where(const Node* n) {
  std::ostringstream os;
  os << n->kind().toQualString();
  torch::jit::SourceRange range = n->sourceRange();
  if (auto original = range.findSourceRangeThatGenerated()) range = *original;
  if (range.source()) {
    if (auto loc = range.file_line_col()) os << " at " << std::get<0>(*loc) << ":" << std::get<1>(*loc);
    std::string text = range.text().str();
    text = text.substr(0, text.find('\n'));
    if (text.size() > 80) text = text.substr(0, 77) + "...";
    if (!text.empty()) os << " (\"" << text << "\")";
  }
  return os.str();
}

std::optional<std::string> path_of(const Value* v, const Value* self) {
  if (v == self) return std::string();
  if (v->node()->kind() != c10::prim::GetAttr) return std::nullopt;
  const auto parent = path_of(v->node()->input(0), self);
  if (!parent) return std::nullopt;
  const std::string& name = v->node()->s(c10::attr::name);
  return parent->empty() ? name : *parent + "." + name;
}

bool movable(const Node* n, const Value* self) {
  return n->kind() == c10::prim::Constant ||
         (n->kind() == c10::prim::GetAttr && path_of(n->output(), self).has_value());
}

std::optional<std::string> called_path(const Node* n, const Value* self) {
  if (n->kind() != c10::prim::CallMethod || n->s(c10::attr::name) != "forward") return std::nullopt;
  return path_of(n->input(0), self);
}

void feed_attribute(torch::jit::Block* block, const Value* self, const std::string& path, Value* value) {
  for (auto it = block->nodes().begin(); it != block->nodes().end();) {
    Node* n = *it++;
    for (Block* sub : n->blocks()) feed_attribute(sub, self, path, value);
    if (n->kind() == c10::prim::GetAttr && path_of(n->output(), self) == path) {
      n->output()->replaceAllUsesWith(value);
      n->destroy();
    }
  }
}

// A segment takes (self, *ins) and returns its one out, or a tuple of several.
bool is_tensor(const Value* v) { return v->type()->isSubtypeOf(*c10::TensorType::get()); }

}  // namespace conveyor
