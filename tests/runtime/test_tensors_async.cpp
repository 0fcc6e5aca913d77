// The asynchronous methods on models that pass several tensors between
// stages: a mask beside the activations, and an encoder's memory that rides
// along to a later stage's attention. Bit for bit in float64 against the
// sequential reference trainer (tests/reference_trainer.h).
#include "reference_trainer.h"
#include "test_models.h"

namespace conveyor {
namespace {

using testing::Method;

// {x, mask} -> mask applied in two stages, dropped before the head.
torch::nn::Sequential masked_mlp() {
  auto masked = [](Tensors t) { return Tensors{t[0] * t[1], t[1]}; };
  torch::nn::Sequential m(OnSlot(0, torch::nn::Linear(8, 8)), TensorsFunction(masked, "mask", 2),
                          OnSlot(0, torch::nn::Tanh()), OnSlot(0, torch::nn::Linear(8, 8)),
                          TensorsFunction(masked, "mask", 2), OnSlot(0, torch::nn::Tanh()),
                          TensorsFunction([](Tensors t) { return Tensors{t[0]}; }, "drop the mask", 2),
                          torch::nn::Linear(8, 3));
  m->to(torch::kFloat64);
  return m;
}

// {memory, h} -> {memory, tanh(W [h; attention(h, memory)])}.
struct AttendImpl : torch::nn::Cloneable<AttendImpl>, TensorsLayer {
  explicit AttendImpl(int64_t hidden) : hidden(hidden) { reset(); }
  void reset() override { out = register_module("out", torch::nn::Linear(2 * hidden, hidden)); }
  int64_t num_inputs() const override { return 2; }
  Tensors forward(Tensors t) override {
    const at::Tensor weights = torch::softmax(torch::bmm(t[1], t[0].transpose(1, 2)), -1);
    return {t[0], torch::tanh(out(torch::cat({t[1], torch::bmm(weights, t[0])}, -1)))};
  }
  int64_t hidden;
  torch::nn::Linear out{nullptr};
};
TORCH_MODULE(Attend);

// {source ids, target ids} -> logits; the memory crosses every cut after layer 2.
torch::nn::Sequential encoder_decoder() {
  using Lstm = FirstOutput<torch::nn::LSTM>;
  torch::nn::Sequential m(OnSlot(0, torch::nn::Embedding(testing::kVocab, 6)),
                          OnSlot(0, Lstm(torch::nn::LSTMOptions(6, 6).batch_first(true))),
                          OnSlot(1, torch::nn::Embedding(testing::kVocab, 6)),
                          OnSlot(1, Lstm(torch::nn::LSTMOptions(6, 6).batch_first(true))), Attend(6),
                          OnSlot(1, torch::nn::Linear(6, testing::kVocab)),
                          TensorsFunction([](Tensors t) { return Tensors{t[1]}; }, "drop the memory", 2));
  m->to(torch::kFloat64);
  return m;
}

using testing::MethodCase;

using MakeBatch = std::function<std::pair<std::vector<Tensors>, std::vector<Tensors>>(int microbatches)>;

void check_against_reference(const std::function<torch::nn::Sequential()>& make, const MakeBatch& batch,
                             const TensorsLossFn& loss, const MethodCase& m, int k) {
  const std::string where = std::string(m.schedule) + (m.vertical_sync ? "+vertical-sync" : "") + " K=" +
                            std::to_string(k);
  torch::manual_seed(100 + k);
  auto model = make();
  auto reference_model = testing::clone_of(model);
  const OptimizerFactory sgd = [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.05).momentum(0.9));
  };
  const int microbatches = k + 1;
  StageRunner pipe(model, PipelineOptions()
                           .workers(k)
                           .microbatches(microbatches)
                           .schedule(m.schedule)
                           .vertical_sync(m.vertical_sync)
                           .optimizer(sgd));
  testing::ReferenceTrainer reference(testing::split_like_pipeline(reference_model, k), m.reference, sgd);
  for (int step = 0; step < 4; ++step) {
    const auto [inputs, targets] = batch(microbatches);
    pipe.train_microbatches(inputs, targets, loss);
    reference.step(inputs, targets, loss);
    const auto ref = reference_model->named_parameters();
    for (const auto& [name, p] : pipe.named_parameters()) {
      ASSERT_TRUE(torch::equal(p, *ref.find(name))) << where << " step " << step << ": " << name << " differs by "
                                                    << (p - *ref.find(name)).abs().max().item<double>();
    }
  }
}

TEST(TensorsAsync, ATwoInputModelEqualsTheReferenceBitForBit) {
  const MakeBatch batch = [](int microbatches) {
    std::vector<Tensors> inputs, targets;
    for (int i = 0; i < microbatches; ++i) {
      const at::Tensor x = torch::randn({3, 8}, torch::kFloat64);
      inputs.push_back({x, (torch::rand({3, 8}) > 0.3).to(torch::kFloat64)});
      targets.push_back({torch::tanh(x.narrow(1, 0, 3))});
    }
    return std::make_pair(inputs, targets);
  };
  const TensorsLossFn loss = [](const Tensors& out, const Tensors& t) { return testing::mse(out[0], t[0]); };
  for (const auto& m : testing::kAsyncMethods) {
    for (int k = 2; k <= 4; ++k) check_against_reference(masked_mlp, batch, loss, m, k);
  }
}

TEST(TensorsAsync, AnEncoderDecoderWithMicrobatchesOfTheirOwnLengths) {
  // Every mini-batch has its own source and target lengths (bucketing).
  const MakeBatch batch = [](int microbatches) {
    std::vector<Tensors> inputs, targets;
    for (int i = 0; i < microbatches; ++i) {
      const int64_t source = 3 + i % 3, target = 2 + (i * 2) % 5;
      inputs.push_back({torch::randint(testing::kVocab, {2, source}), torch::randint(testing::kVocab, {2, target})});
      targets.push_back({torch::randint(testing::kVocab, {2, target})});
    }
    return std::make_pair(inputs, targets);
  };
  const TensorsLossFn loss = [](const Tensors& out, const Tensors& t) { return testing::lm_loss(out[0], t[0]); };
  for (const auto& m : testing::kAsyncMethods) {
    for (int k = 2; k <= 4; ++k) check_against_reference(encoder_decoder, batch, loss, m, k);
  }
}

}  // namespace
}  // namespace conveyor
