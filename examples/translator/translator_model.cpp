#include "examples/translator/translator_model.h"

#include "ops/tensors_layers.h"

#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace conveyor::examples {

namespace {

using Lstm = conveyor::FirstOutput<torch::nn::LSTM>;

// {memory [n, S, H], source mask [n, S], decoder states [n, T, H]} ->
// {attentional states [n, T, E]}: scores h_t . W m_s over the source
// positions the mask keeps, their softmax's mix of the memory as context,
// then W_c [context; h_t] (no tanh: through a tanh the decoder at first
// learned next to nothing) and dropout.
struct AttentionImpl : torch::nn::Cloneable<AttentionImpl>, TensorsLayer {
  AttentionImpl(int64_t hidden, int64_t out, double dropout) : hidden(hidden), out(out), dropout(dropout) { reset(); }
  void reset() override {
    score = register_module("score", torch::nn::Linear(torch::nn::LinearOptions(hidden, hidden).bias(false)));
    combine = register_module("combine", torch::nn::Linear(2 * hidden, out));
    drop = register_module("drop", torch::nn::Dropout(dropout));
  }
  int64_t num_inputs() const override { return 3; }
  Tensors forward(Tensors t) override {
    const at::Tensor& memory = t[0];
    const at::Tensor& states = t[2];
    at::Tensor scores = torch::bmm(states, score(memory).transpose(1, 2));  // [n, T, S]
    scores = scores.masked_fill(t[1].logical_not().unsqueeze(1), -std::numeric_limits<float>::infinity());
    const at::Tensor context = torch::bmm(torch::softmax(scores, -1), memory);  // [n, T, H]
    return {drop(combine(torch::cat({context, states}, -1)))};
  }
  int64_t hidden, out;
  double dropout;
  torch::nn::Linear score{nullptr}, combine{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Attention);

torch::nn::LSTMOptions lstm_options(int64_t in, int64_t hidden) {
  return torch::nn::LSTMOptions(in, hidden).batch_first(true);
}

// A [rows, width] tensor of id lists padded with kPadId; `prefix` and
// `suffix` (kPadId: none) go around each list.
at::Tensor padded(const std::vector<const std::vector<int64_t>*>& rows, int64_t prefix, int64_t suffix) {
  const int64_t extra = (prefix != kPadId) + (suffix != kPadId);
  int64_t width = 0;
  for (const auto* r : rows) width = std::max(width, static_cast<int64_t>(r->size()) + extra);
  std::vector<int64_t> flat(rows.size() * static_cast<size_t>(width), kPadId);
  for (size_t i = 0; i < rows.size(); ++i) {
    int64_t* row = flat.data() + i * static_cast<size_t>(width);
    if (prefix != kPadId) *row++ = prefix;
    row = std::copy(rows[i]->begin(), rows[i]->end(), row);
    if (suffix != kPadId) *row = suffix;
  }
  return torch::tensor(flat, torch::kLong).view({static_cast<int64_t>(rows.size()), width});
}

constexpr size_t kFirstDecoderLayer = 4;

}  // namespace

Translator make_translator(const TranslatorShape& s) {
  const int64_t E = s.embed, H = s.hidden;
  Translator t;
  t.layers = torch::nn::Sequential(
      OnSlot(0, torch::nn::Embedding(s.source_vocab, E)), OnSlot(0, torch::nn::Dropout(s.dropout)),
      OnSlot(0, Lstm(lstm_options(E, H))), OnSlot(0, Lstm(lstm_options(H, H))),
      OnSlot(2, torch::nn::Embedding(s.target_vocab, E)), OnSlot(2, torch::nn::Dropout(s.dropout)),
      OnSlot(2, Lstm(lstm_options(E, H))), OnSlot(2, Lstm(lstm_options(H, H))), Attention(H, E, s.dropout),
      OnSlot(0, torch::nn::Linear(E, s.target_vocab)));
  t.names = {"source embedding", "dropout",        "encoder LSTM 1", "encoder LSTM 2", "target embedding",
             "dropout",          "decoder LSTM 1", "decoder LSTM 2", "attention",      "projection"};
  const double lstm_in = 4.0 * H * (E + H), lstm_deep = 4.0 * H * (H + H);
  // Per target token, with source and target of about the same length; the
  // attention reads every source position.
  t.costs = {double(E), 1, lstm_in, lstm_deep, double(E), 1, lstm_in, lstm_deep, 2.0 * H * H + 2.0 * H * E + 40.0 * H,
             double(E) * double(s.target_vocab)};
  t.tie = {"4.inner.weight", "9.inner.weight"};
  return t;
}

TranslationBatch make_batch(const std::vector<EncodedPair>& pairs, const std::vector<int64_t>& indices) {
  std::vector<const std::vector<int64_t>*> sources, targets;
  TranslationBatch b;
  for (const int64_t i : indices) {
    sources.push_back(&pairs.at(static_cast<size_t>(i)).source);
    targets.push_back(&pairs.at(static_cast<size_t>(i)).target);
    b.target_tokens += static_cast<int64_t>(pairs[static_cast<size_t>(i)].target.size()) + 1;
  }
  const at::Tensor source = padded(sources, kPadId, kPadId);
  b.inputs = {source, source.ne(kPadId), padded(targets, kBosId, kPadId)};
  b.targets = {padded(targets, kPadId, kEosId)};
  b.sentences = static_cast<int64_t>(indices.size());
  return b;
}

std::vector<TranslationBatch> make_microbatches(const std::vector<EncodedPair>& pairs,
                                                const std::vector<int64_t>& indices, int64_t parts) {
  const auto n = static_cast<int64_t>(indices.size());
  if (parts < 1 || parts > n) {
    throw std::invalid_argument("cannot cut a batch of " + std::to_string(n) + " pairs into " + std::to_string(parts) +
                                " micro-batches");
  }
  std::vector<TranslationBatch> out;
  int64_t start = 0;
  for (int64_t k = 0; k < parts; ++k) {
    const int64_t size = n / parts + (k < n % parts ? 1 : 0);
    out.push_back(make_batch(pairs, std::vector<int64_t>(indices.begin() + start, indices.begin() + start + size)));
    start += size;
  }
  return out;
}

Tensors forward_layers(const torch::nn::Sequential& layers, size_t begin, size_t end, Tensors values) {
  for (size_t i = begin; i < end; ++i) {
    auto* layer = dynamic_cast<TensorsLayer*>(layers->ptr(i).get());
    if (!layer) throw std::logic_error("translator layer " + std::to_string(i) + " takes no list of tensors");
    values = layer->forward(std::move(values));
  }
  return values;
}

at::Tensor translation_loss(const Tensors& outputs, const Tensors& targets) {
  namespace F = torch::nn::functional;
  const at::Tensor& logits = outputs[0];
  return F::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets[0].reshape({-1}),
                          F::CrossEntropyFuncOptions().ignore_index(kPadId));
}

std::vector<std::vector<int64_t>> greedy_translate(const torch::nn::Sequential& layers,
                                                   const std::vector<EncodedPair>& pairs,
                                                   const std::vector<int64_t>& indices, int64_t max_length) {
  torch::NoGradGuard no_grad;
  const TranslationBatch batch = make_batch(pairs, indices);
  const int64_t n = batch.sentences;
  Tensors encoded = forward_layers(layers, 0, kFirstDecoderLayer, batch.inputs);
  at::Tensor prefix = torch::full({n, 1}, kBosId, torch::kLong);
  at::Tensor done = torch::zeros({n}, torch::kBool);
  for (int64_t step = 0; step < max_length && !done.all().item<bool>(); ++step) {
    const Tensors out = forward_layers(layers, kFirstDecoderLayer, layers->size(), {encoded[0], encoded[1], prefix});
    at::Tensor next = out[0].select(1, out[0].size(1) - 1).argmax(-1);
    next = next.masked_fill(done, kPadId);
    done = done.logical_or(next.eq(kEosId));
    prefix = torch::cat({prefix, next.unsqueeze(1)}, 1);
  }
  std::vector<std::vector<int64_t>> result(static_cast<size_t>(n));
  const at::Tensor ids = prefix.narrow(1, 1, prefix.size(1) - 1).contiguous();
  const int64_t* data = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < ids.size(1); ++j) {
      const int64_t id = data[i * ids.size(1) + j];
      if (id == kEosId || id == kPadId) break;
      result[static_cast<size_t>(i)].push_back(id);
    }
  }
  return result;
}

}  // namespace conveyor::examples
