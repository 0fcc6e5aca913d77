#include "examples/lm_model.h"

#include "examples/flags.h"
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

}  // namespace conveyor::examples
