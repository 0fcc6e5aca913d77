#include "plugin/script/script_nodes.h"

#include <algorithm>
#include <sstream>
#include <string_view>

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

// TorchScript compiles each @overload of a forward (nn.LSTM's, nn.GRU's) as
// forward__0, forward__1, ... and calls the one that fits the arguments.
bool is_forward(const std::string& method) {
  constexpr std::string_view kOverload = "forward__";
  if (method == "forward") return true;
  if (method.size() <= kOverload.size() || method.compare(0, kOverload.size(), kOverload) != 0) return false;
  return std::all_of(method.begin() + kOverload.size(), method.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::optional<std::string> called_path(const Node* n, const Value* self) {
  if (n->kind() != c10::prim::CallMethod || !is_forward(n->s(c10::attr::name))) return std::nullopt;
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

bool is_number(const Value* v) {
  const auto kind = v->type()->kind();
  return kind == c10::TypeKind::IntType || kind == c10::TypeKind::FloatType || kind == c10::TypeKind::BoolType;
}

bool travels(const Value* v) { return is_tensor(v) || is_number(v); }

}  // namespace conveyor
