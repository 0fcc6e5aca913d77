#include "ops/fused_lstm/fused_lstm_swap.h"

#include "ops/fused_lstm/fused_lstm_aten.h"
#include "ops/fused_lstm/fused_lstm_module.h"
#include "ops/swap.h"

#include <torch/csrc/jit/ir/constants.h>
#include <torch/nn/modules/rnn.h>

namespace conveyor {
namespace {

std::optional<torch::nn::AnyModule> fail(std::string* why_not, std::string reason) {
  if (why_not != nullptr) *why_not = std::move(reason);
  return std::nullopt;
}

bool is_lstm(const torch::nn::Module& module) { return dynamic_cast<const torch::nn::LSTMImpl*>(&module) != nullptr; }

const RegisterFusedSwapper kLstmSwapper{FusedSwapper{"LSTM -> FusedLSTM", is_lstm, make_fused_lstm_from}};

// TorchScript: aten::lstm.input(input, hx[], params[], has_biases, num_layers,
// dropout, train, bidirectional, batch_first), the call a scripted or traced
// torch.nn.LSTM makes for a tensor input (the PackedSequence overload,
// aten::lstm.data, takes a tensor second and is left alone).
bool is_aten_lstm_call(const torch::jit::Node& node) {
  static const c10::Symbol kAtenLstm = c10::Symbol::fromQualString("aten::lstm");
  return node.kind() == kAtenLstm && node.inputs().size() == 9 &&
         node.input(1)->type()->kind() == c10::TypeKind::ListType;
}

// The number of tensors in the params list, where it can be known before run time:
// a list built in the graph (traced) or an attribute of the module (scripted).
std::optional<int64_t> count_params(const torch::jit::Value* params, const torch::jit::Module& owner) {
  const torch::jit::Node* producer = params->node();
  if (producer->kind() == c10::prim::ListConstruct) return static_cast<int64_t>(producer->inputs().size());
  if (producer->kind() == c10::prim::GetAttr && producer->input(0)->type().get() == owner.type().get()) {
    const c10::IValue list = owner.attr(producer->s(c10::attr::name));
    if (list.isList()) return static_cast<int64_t>(list.toListRef().size());
  }
  return std::nullopt;
}

std::optional<std::string> script_lstm_why_not(const torch::jit::Node& node, const torch::jit::Module& owner) {
  const auto has_biases = torch::jit::constant_as<bool>(node.input(3));
  const auto num_layers = torch::jit::constant_as<int64_t>(node.input(4));
  const auto bidirectional = torch::jit::constant_as<bool>(node.input(7));
  if (bidirectional.value_or(false)) return aten_lstm_unsupported(true, 0, true, 0);
  const auto num_params = count_params(node.input(2), owner);
  if (!has_biases || !num_layers || !num_params) return std::nullopt;  // the op judges at run time
  return aten_lstm_unsupported(false, *num_params, *has_biases, *num_layers);
}

const RegisterScriptSwapper kScriptLstmSwapper{
    ScriptSwapper{"aten::lstm -> conveyor::lstm", "conveyor::lstm", is_aten_lstm_call, script_lstm_why_not}};

}  // namespace

std::optional<torch::nn::AnyModule> make_fused_lstm_from(const std::shared_ptr<torch::nn::Module>& m,
                                                         std::string* why_not) {
  const auto lstm = std::dynamic_pointer_cast<torch::nn::LSTMImpl>(m);
  if (lstm == nullptr) return fail(why_not, "not a torch::nn::LSTM");
  const auto& options = lstm->options;
  if (options.bidirectional()) return fail(why_not, "bidirectional LSTM: FusedLSTM runs one direction only");
  if (options.proj_size() > 0) {
    const std::string proj = std::to_string(options.proj_size());
    return fail(why_not, "LSTM with proj_size=" + proj + ": FusedLSTM has no projection");
  }
  auto fused = std::make_shared<FusedLSTMImpl>(options, *lstm);
  fused->train(lstm->is_training());
  return torch::nn::AnyModule(fused);
}

}  // namespace conveyor
