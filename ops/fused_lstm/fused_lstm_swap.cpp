#include "ops/fused_lstm/fused_lstm_swap.h"

#include "ops/fused_lstm/fused_lstm_module.h"
#include "ops/swap.h"

#include <torch/nn/modules/rnn.h>

namespace conveyor {
namespace {

std::optional<torch::nn::AnyModule> fail(std::string* why_not, std::string reason) {
  if (why_not != nullptr) *why_not = std::move(reason);
  return std::nullopt;
}

bool is_lstm(const torch::nn::Module& module) { return dynamic_cast<const torch::nn::LSTMImpl*>(&module) != nullptr; }

const RegisterFusedSwapper kLstmSwapper{FusedSwapper{"LSTM -> FusedLSTM", is_lstm, make_fused_lstm_from}};

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
