#pragma once
// What the graph cutting (script_graph.cpp) asks of single nodes and values
// of a TorchScript forward graph: where a node came from, which submodule or
// attribute a value is, what may be copied into every segment.

#include <torch/csrc/jit/ir/ir.h>

#include <optional>
#include <string>
#include <vector>

namespace conveyor {

std::string join(const std::vector<std::string>& items);  // "a, b, c"
std::vector<std::string> split_path(const std::string& path);  // "a.b" -> {"a", "b"}

// A node's kind and, where the model kept its source, the line that made it:
// "aten::add at model.py:12 (\"return x + self.body(x)\")".
std::string where(const torch::jit::Node* n);

// The dotted path of a submodule or attribute reached from self by GetAttrs.
std::optional<std::string> path_of(const torch::jit::Value* v, const torch::jit::Value* self);

// Constants and attribute reads are copied into every segment that uses
// them, so they never count as values crossing a cut.
bool movable(const torch::jit::Node* n, const torch::jit::Value* self);

// Whether `method` is a forward: "forward", or one of its overloads
// ("forward__0", as a scripted nn.LSTM is called).
bool is_forward(const std::string& method);

// The submodule whose forward (or one of its overloads) `n` calls, if it is
// such a call; the method called is n->s(c10::attr::name).
std::optional<std::string> called_path(const torch::jit::Node* n, const torch::jit::Value* self);

bool is_tensor(const torch::jit::Value* v);
// An int, float or bool: crosses a cut as a 0-dim tensor (as the export front
// end sends symbolic sizes), made a number again on the other side.
bool is_number(const torch::jit::Value* v);
// What may cross a cut: a tensor or a number.
bool travels(const torch::jit::Value* v);

// Replaces every read of the attribute at `path` in `block` (and the blocks
// inside it) by `value`.
void feed_attribute(torch::jit::Block* block, const torch::jit::Value* self, const std::string& path,
                    torch::jit::Value* value);

}  // namespace conveyor
