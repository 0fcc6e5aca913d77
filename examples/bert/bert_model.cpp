#include "examples/bert/bert_model.h"

#include "examples/bert/bert_data.h"
#include "ops/adapters.h"
#include "ops/fused_attention/encoder_layer.h"

#include <torch/torch.h>

#include <cmath>
#include <stdexcept>

namespace conveyor::examples {

namespace {

// {tokens [N, L], padding [N, L]} -> {token + position embeddings, normalised [L, N, E], padding}.
class BertEmbeddingsImpl : public torch::nn::Cloneable<BertEmbeddingsImpl>, public TensorsLayer {
 public:
  explicit BertEmbeddingsImpl(const BertConfig& c) : config_(c) { reset(); }
  void reset() override {
    token = register_module("token", torch::nn::Embedding(config_.vocab, config_.hidden));
    position = register_module("position", torch::nn::Embedding(config_.max_len, config_.hidden));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config_.hidden})));
    dropout = register_module("dropout", torch::nn::Dropout(config_.dropout));
  }
  Tensors forward(Tensors in) override {
    const at::Tensor& tokens = in[0];
    const at::Tensor positions = torch::arange(tokens.size(1), tokens.options());
    const at::Tensor h = dropout(norm(token(tokens) + position(positions).unsqueeze(0)));
    return {h.transpose(0, 1), in[1]};
  }
  int64_t num_inputs() const override { return 2; }
  void pretty_print(std::ostream& s) const override { s << "BertEmbeddings(" << config_.hidden << ")"; }

  torch::nn::Embedding token{nullptr}, position{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Dropout dropout{nullptr};

 private:
  BertConfig config_;
};
TORCH_MODULE(BertEmbeddings);

// {hidden [L, N, E], padding [N, L]} -> {encoded hidden, padding}: the mask
// keeps attention off the pads and rides on to the next layer.
class BertEncoderImpl : public torch::nn::Cloneable<BertEncoderImpl>, public TensorsLayer {
 public:
  explicit BertEncoderImpl(const BertConfig& c) : config_(c) { reset(); }
  void reset() override {
    layer = register_module(
        "layer", EncoderLayer(torch::nn::TransformerEncoderLayerOptions(config_.hidden, config_.heads)
                                  .dim_feedforward(config_.feedforward)
                                  .dropout(config_.dropout)
                                  .activation(torch::kGELU)));
  }
  Tensors forward(Tensors in) override { return {layer(in[0], at::Tensor(), in[1]), in[1]}; }
  int64_t num_inputs() const override { return 2; }
  void pretty_print(std::ostream& s) const override { s << "BertEncoder(" << config_.hidden << ")"; }

  EncoderLayer layer{nullptr};

 private:
  BertConfig config_;
};
TORCH_MODULE(BertEncoder);

// {hidden [L, N, E], padding} -> {logits [N, L, V]}.
class MlmHeadImpl : public torch::nn::Cloneable<MlmHeadImpl>, public TensorsLayer {
 public:
  explicit MlmHeadImpl(const BertConfig& c) : config_(c) { reset(); }
  void reset() override {
    dense = register_module("dense", torch::nn::Linear(config_.hidden, config_.hidden));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config_.hidden})));
    decoder = register_module("decoder", torch::nn::Linear(config_.hidden, config_.vocab));
  }
  Tensors forward(Tensors in) override {
    return {decoder(norm(torch::gelu(dense(in[0].transpose(0, 1)))))};
  }
  int64_t num_inputs() const override { return 2; }
  void pretty_print(std::ostream& s) const override { s << "MlmHead(" << config_.hidden << ")"; }

  torch::nn::Linear dense{nullptr}, decoder{nullptr};
  torch::nn::LayerNorm norm{nullptr};

 private:
  BertConfig config_;
};
TORCH_MODULE(MlmHead);

constexpr double kPositionScale = 0.02;  // about the token embeddings' size

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

}  // namespace

BertModel make_bert(const BertConfig& c) {
  check(c.vocab >= 8 && c.hidden >= 1 && c.heads >= 1 && c.layers >= 1 && c.feedforward >= 1 && c.max_len >= 3,
        "BERT: the vocabulary needs at least 8 pieces and every size at least 1 (3 positions)");
  check(c.hidden % c.heads == 0, "BERT: the hidden size (" + std::to_string(c.hidden) +
                                     ") must be a multiple of the number of heads (" + std::to_string(c.heads) + ")");
  BertModel m;
  BertEmbeddings embeddings(c);
  m.layers->push_back(embeddings);
  m.names.push_back("embeddings");
  const auto e = static_cast<double>(c.hidden), f = static_cast<double>(c.feedforward);
  m.costs.push_back(2 * e);
  for (int64_t i = 0; i < c.layers; ++i) {
    m.layers->push_back(BertEncoder(c));
    m.names.push_back("encoder " + std::to_string(i + 1));
    m.costs.push_back(4 * e * e + 2 * e * f + 2 * e * static_cast<double>(c.max_len) / 2);
  }
  MlmHead head(c);
  m.layers->push_back(head);
  m.names.push_back("mlm head");
  m.costs.push_back(e * e + e * static_cast<double>(c.vocab));
  torch::NoGradGuard no_grad;
  for (auto& p : m.layers->named_parameters()) {
    if (p.key().ends_with("norm.weight") || p.key().ends_with("norm1.weight") || p.key().ends_with("norm2.weight")) {
      p.value().fill_(1);
    } else if (p.value().dim() >= 2) {
      p.value().normal_(0, 0.02);
    } else {
      p.value().zero_();
    }
  }
  // Positions start as sinusoids (learned from there): from random ones a
  // model this small takes thousands of updates to find word order, and
  // until then predicts every masked piece by its frequency alone.
  const at::Tensor pos = torch::arange(c.max_len, torch::kDouble).unsqueeze(1);
  const at::Tensor freq =
      torch::exp(torch::arange(0, c.hidden, 2, torch::kDouble) * (-std::log(10000.0) / static_cast<double>(c.hidden)));
  at::Tensor table = torch::zeros({c.max_len, c.hidden}, torch::kDouble);
  table.index_put_({torch::indexing::Slice(), torch::indexing::Slice(0, c.hidden, 2)}, torch::sin(pos * freq));
  table.index_put_({torch::indexing::Slice(), torch::indexing::Slice(1, c.hidden, 2)},
                   torch::cos(pos * freq).narrow(1, 0, c.hidden / 2));
  embeddings->position->weight.copy_(table * kPositionScale);
  head->decoder->weight.copy_(embeddings->token->weight);
  const std::string last = std::to_string(m.layers->size() - 1);
  m.tied = {"0.token.weight", last + ".decoder.weight"};
  return m;
}

at::Tensor mlm_loss(const at::Tensor& logits, const at::Tensor& labels) {
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}), labels.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnore));
}

MlmScore mlm_score(const at::Tensor& logits, const at::Tensor& labels) {
  const at::Tensor flat = labels.reshape({-1}).to(logits.device());
  const at::Tensor keep = flat.ne(kIgnore);
  const at::Tensor picked = logits.reshape({-1, logits.size(-1)}).index({keep});
  const at::Tensor target = flat.index({keep});
  MlmScore s;
  s.predictions = target.numel();
  s.loss_sum = torch::nn::functional::cross_entropy(picked, target,
                                                    torch::nn::functional::CrossEntropyFuncOptions().reduction(
                                                        torch::kSum))
                   .item<double>();
  s.correct = picked.argmax(-1).eq(target).sum().item<int64_t>();
  return s;
}

}  // namespace conveyor::examples
