#pragma once
// conveyor::swap_fused_ops: walks a module tree and puts Conveyor's fused
// modules in place of the torch::nn modules they can stand in for, as listed
// in a table of swappers that each fused op fills (see RegisterFusedSwapper).
//
// torch::nn::LSTM -> conveyor::FusedLSTM: the FusedLSTM shares the LSTM's
// parameter tensors (the same at::Tensor objects, not copies), so an optimizer
// built before the swap keeps updating the weights the model now uses, and the
// values are unchanged.
//
// A child can be replaced only where its parent holds it by name alone:
//   torch::nn::Sequential (its AnyModule entry is replaced too),
//   torch::nn::ModuleList, torch::nn::ModuleDict, and adapters that
//   implement conveyor::WrapsInnerModule (conveyor::FirstOutput).
// Any other parent may keep a typed member (e.g. `torch::nn::LSTM lstm;`)
// that Module::replace_module cannot update, so such children are skipped and
// reported; so are modules whose options the fused module does not support.
//
//   auto report = conveyor::swap_fused_ops(model.ptr());
//   std::cout << report.to_string();
//
// TorchScript models: swap_fused_ops(torch::jit::Module&) points the graphs'
// calls of an op (aten::lstm) at the fused op with the same signature
// (conveyor::lstm), as listed in a second table (RegisterScriptSwapper). A
// scripted or traced torch.nn.LSTM runs fused then, whatever module holds it.

#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace conveyor {

struct SwapReport {
  struct Swapped {
    std::string path;  // dotted module path, e.g. "1.inner"
    std::string kind;  // e.g. "LSTM -> FusedLSTM"
  };
  struct Skipped {
    std::string path;
    std::string reason;
  };
  std::vector<Swapped> swapped;
  std::vector<Skipped> skipped;

  std::vector<std::string> swapped_paths() const;
  // The reason `path` was skipped, or nullopt if it was not.
  std::optional<std::string> skip_reason(const std::string& path) const;
  std::string to_string() const;
};

// How to replace one kind of module with its fused counterpart.
struct FusedSwapper {
  std::string kind;  // for the report, e.g. "LSTM -> FusedLSTM"
  // Whether `module` is of the kind this swapper replaces.
  std::function<bool(const torch::nn::Module& module)> matches;
  // The replacement (same forward signature, same parameter names), or
  // nullopt with the reason in *why_not when this module's options are not
  // supported.
  std::function<std::optional<torch::nn::AnyModule>(const std::shared_ptr<torch::nn::Module>& module,
                                                    std::string* why_not)>
      make_replacement;
};

// The table swap_fused_ops consults. Each fused op adds its own entry when the
// library loads, so the table holds exactly the ops built into the plugin:
//   const conveyor::RegisterFusedSwapper kRegistered{my_swapper()};  // at namespace scope
void register_fused_swapper(FusedSwapper swapper);
std::vector<FusedSwapper> fused_swappers();

struct RegisterFusedSwapper {
  explicit RegisterFusedSwapper(FusedSwapper swapper) { register_fused_swapper(std::move(swapper)); }
};

SwapReport swap_fused_ops(std::shared_ptr<torch::nn::Module> root);

// How to point a TorchScript graph's calls of one op at a fused op that takes
// the same arguments and returns the same results.
struct ScriptSwapper {
  std::string kind;  // for the report, e.g. "aten::lstm -> conveyor::lstm"
  std::string to;    // the replacement op's qualified name, e.g. "conveyor::lstm"
  // Whether `node` is a call this swapper replaces (kind and overload).
  std::function<bool(const torch::jit::Node& node)> matches;
  // Why this call cannot run fused, judged from its constant arguments and
  // the attributes of `owner` (the module whose code holds it), or nullopt.
  // (Arguments only known at run time are for the fused op to judge: it must
  // give the original op's result for any of them.)
  std::function<std::optional<std::string>(const torch::jit::Node& node, const torch::jit::Module& owner)> why_not;
};
void register_script_swapper(ScriptSwapper swapper);
std::vector<ScriptSwapper> script_swappers();

struct RegisterScriptSwapper {
  explicit RegisterScriptSwapper(ScriptSwapper swapper) { register_script_swapper(std::move(swapper)); }
};

// Replaces `module` with a clone that shares its parameters, buffers and
// attributes (the same tensors) but has its own copy of the code, in which
// every call a script swapper matches, and does not refuse, calls the fused
// op. The report names each module whose code held such a call ("" is the
// model itself): swapped, or skipped with the reason. Other handles to the
// original module keep running the original code. Call it before the model
// is first run or pipelined (make_script_pipeline).
SwapReport swap_fused_ops(torch::jit::Module& module);

}  // namespace conveyor
