#include "examples/common/lm_model.h"

#include "examples/common/flags.h"
#include "plugin/conveyor.h"

#include <torch/torch.h>

#include <cmath>

namespace conveyor::examples {

LanguageModel make_language_model(int64_t vocab, int64_t embed, int64_t hidden, double dropout) {
  using namespace torch::nn;
  LanguageModel m;
  auto add = [&](AnyModule layer, std::string name, double cost) {
    m.layers->push_back(std::move(layer));
    m.names.push_back(std::move(name));
    m.costs.push_back(cost);
  };
  auto dims = [](int64_t in, int64_t out) { return "(" + std::to_string(in) + "->" + std::to_string(out) + ")"; };
  auto lstm = [&](int64_t in) {
    return AnyModule(conveyor::FirstOutput<LSTM>(LSTMOptions(in, hidden).batch_first(true)));
  };
  const std::string drop = "dropout(" + fixed(dropout, 2) + ")";
  const double h = static_cast<double>(hidden), e = static_cast<double>(embed), v = static_cast<double>(vocab);
  m.decoder = Linear(hidden, vocab);
  add(AnyModule(Embedding(vocab, embed)), "embedding" + dims(vocab, embed), e);
  add(AnyModule(Dropout(dropout)), drop, e);
  add(lstm(embed), "lstm" + dims(embed, hidden), 3 * 4 * h * (e + h));
  add(AnyModule(Dropout(dropout)), drop, h);
  add(lstm(hidden), "lstm" + dims(hidden, hidden), 3 * 4 * h * (h + h));
  add(AnyModule(Dropout(dropout)), drop, h);
  add(AnyModule(m.decoder), "linear" + dims(hidden, vocab), 3 * h * v + 4 * v);  // + the loss's softmax
  return m;
}

// Starts the decoder's bias at the log unigram frequencies of the train split
// (add-one smoothed), so that the first steps need not learn how often each
// word occurs and go straight to learning from context.
void init_decoder_bias(torch::nn::Linear& decoder, const std::vector<int64_t>& train, int64_t vocab) {
  std::vector<float> log_freq(vocab, 1.0f);
  for (int64_t id : train) log_freq[id] += 1.0f;
  for (float& f : log_freq) f = std::log(f / static_cast<float>(train.size() + vocab));
  torch::NoGradGuard no_grad;
  decoder->bias.copy_(torch::tensor(log_freq));
}

at::Tensor lm_loss(const at::Tensor& output, const at::Tensor& target) {
  return torch::nn::functional::cross_entropy(output.reshape({-1, output.size(-1)}), target.reshape({-1}));
}

std::pair<at::Tensor, at::Tensor> window_tensors(const TokenGrid& grid, int64_t index, int64_t bptt) {
  auto w = grid.window(index, bptt);
  auto as_tensor = [&](std::vector<int64_t>& ids) { return torch::tensor(ids, torch::kLong).view({grid.rows, w.len}); };
  return {as_tensor(w.inputs), as_tensor(w.targets)};
}

double evaluate(Pipeline& pipe, const TokenGrid& grid, int64_t bptt) {
  pipe.eval();
  torch::NoGradGuard no_grad;
  double total = 0;
  int64_t words = 0;
  for (int64_t i = 0; i < grid.num_windows(bptt); ++i) {
    auto [input, target] = window_tensors(grid, i, bptt);
    const at::Tensor output = pipe.forward(input);
    total += lm_loss(output, target.to(output.device())).item<double>() * static_cast<double>(target.numel());
    words += target.numel();
  }
  pipe.train();
  return total / static_cast<double>(words);
}

double clip_global_norm(const std::vector<at::Tensor>& params, double max_norm) {
  double squares = 0;
  for (const auto& p : params) squares += p.grad().defined() ? p.grad().pow(2).sum().item<double>() : 0.0;
  const double norm = std::sqrt(squares);
  for (const auto& p : params) {
    if (max_norm > 0 && norm > max_norm && p.grad().defined()) p.grad().mul_(max_norm / (norm + 1e-6));
  }
  return norm;
}

}  // namespace conveyor::examples
