// Stage boundaries that carry several tensors (conveyor::Tensors): a mask
// beside the activations, an encoder's memory read stages later, lengths that
// trim each micro-batch to its own width, integer ids that travel forward
// only. The synchronous schedules must still give the unsplit model's
// gradients, and a list of the wrong length must be named where it hurts.
#include "error_of.h"
#include "test_models.h"

#include <atomic>
#include <mutex>
#include <set>

namespace conveyor {
namespace {

using ::testing::HasSubstr;
using testing::error_of;

using testing::kSyncSchedules;
constexpr int64_t kV = 20, kD = 6, kH = 10;
using Lstm = FirstOutput<torch::nn::LSTM>;

// The unsplit model: every layer in order, handed a list or one tensor as a
// stage hands it. Written out here rather than taken from the runtime, so
// that the reference does not share the code under test.
Tensors reference_forward(torch::nn::Sequential model, Tensors x) {
  for (auto& layer : *model) {
    if (auto* t = dynamic_cast<TensorsLayer*>(layer.ptr().get())) {
      x = t->forward(std::move(x));
    } else {
      x = {layer.forward<at::Tensor>(x[0])};
    }
  }
  return x;
}

at::Tensor mse_of_first(const Tensors& out, const Tensors& target) { return testing::mse(out[0], target[0]); }
at::Tensor lm_loss_of_first(const Tensors& out, const Tensors& target) {
  return testing::lm_loss(out[0], target[0]);
}

// One pipelined step against one backward of a clone of the model.
void check_exact(torch::nn::Sequential model, const Tensors& inputs, const Tensors& targets,
                 const TensorsLossFn& loss_fn, const PipelineOptions& options, const std::string& where) {
  auto reference = testing::clone_of(model);  // before the pipeline takes the layers
  const at::Tensor ref_loss = loss_fn(reference_forward(reference, inputs), targets);
  ref_loss.backward();
  StageRunner pipe(model, options);
  const StepResult r = pipe.train_step(inputs, targets, loss_fn);
  testing::expect_same_grads(pipe, reference, 1e-10, 0, where);
  EXPECT_NEAR(r.loss, ref_loss.item<double>(), 1e-10) << where;
}

// After a failed step the next one runs (no hang) and nothing is left over.
void expect_recovers(StageRunner& pipe, torch::nn::Sequential reference, const Tensors& inputs, const Tensors& targets,
                     const TensorsLossFn& loss_fn) {
  for (auto& p : pipe.parameters()) p.mutable_grad() = at::Tensor();
  pipe.train_step(inputs, targets, loss_fn);
  loss_fn(reference_forward(reference, inputs), targets).backward();
  testing::expect_same_grads(pipe, reference, 1e-10, 0, "the step after a failed one");
}

std::string where_of(const char* schedule, const std::string& cut, int m) {
  return std::string(schedule) + " " + cut + " M=" + std::to_string(m);
}

// {x, mask} -> {linear(x) * mask, mask}: a layer of two tensors with weights.
struct MaskedLinearImpl : torch::nn::Cloneable<MaskedLinearImpl>, TensorsLayer {
  MaskedLinearImpl(int64_t in, int64_t out) : in(in), out(out) { reset(); }
  void reset() override { linear = register_module("linear", torch::nn::Linear(in, out)); }
  int64_t num_inputs() const override { return 2; }
  Tensors forward(Tensors t) override { return {linear(t[0]) * t[1], t[1]}; }
  int64_t in, out;
  torch::nn::Linear linear{nullptr};
};
TORCH_MODULE(MaskedLinear);

// {x [N, 8], mask [N, 8] or [8]} -> [N, 3]. The mask is read by layers 2 and
// 4 and dropped by layer 5, so under the uniform cuts it crosses one or more
// boundaries and is read on two stages (K = 4: 0-1 | 2-3 | 4-5 | 6).
torch::nn::Sequential make_masked_mlp() {
  torch::nn::Sequential m(
      OnSlot(0, torch::nn::Linear(8, 8)), OnSlot(0, torch::nn::Tanh()), MaskedLinear(8, 8),
      OnSlot(0, torch::nn::Tanh()),
      TensorsFunction([](Tensors t) { return Tensors{t[0] * t[1] + t[0].sin(), t[1]}; }, "mask again", 2),
      TensorsFunction([](Tensors t) { return Tensors{t[0]}; }, "drop the mask", 2), torch::nn::Linear(8, 3));
  m->to(torch::kFloat64);
  return m;
}

TEST(TensorsExactness, TwoInputModelWithAFloatOrBoolMask) {
  // A float mask gets gradients on the stages that read it (and they go
  // nowhere on stage 0, where it is an input); a bool one travels forward only.
  for (bool bool_mask : {false, true}) {
    for (const char* schedule : kSyncSchedules) {
      for (int k = 2; k <= 4; ++k) {
        for (int m : {1, 3, 4}) {  // 6 samples in 4 micro-batches: 2, 2, 1, 1
          torch::manual_seed(k * 100 + m);
          const at::Tensor x = torch::randn({6, 8}, torch::kFloat64);
          at::Tensor mask = torch::rand({6, 8}) > 0.3;
          if (!bool_mask) mask = mask.to(torch::kFloat64);
          check_exact(make_masked_mlp(), {x, mask}, {torch::randn({6, 3}, torch::kFloat64)}, mse_of_first,
                      PipelineOptions().workers(k).microbatches(m).schedule(schedule),
                      where_of(schedule, "K=" + std::to_string(k), m) + (bool_mask ? " bool mask" : " float mask"));
        }
      }
    }
  }
}

TEST(TensorsExactness, SharedInputsAndTargetsGoWholeToEveryMicrobatch) {
  // A feature mask [8] and class weights [3] belong to no sample: split, they
  // would be cut along their features; shared, every micro-batch reads all.
  torch::manual_seed(3);
  const at::Tensor x = torch::randn({7, 8}, torch::kFloat64), y = torch::randn({7, 3}, torch::kFloat64);
  const at::Tensor mask = (torch::rand({8}) > 0.3).to(torch::kFloat64);
  const at::Tensor weights = torch::rand({3}, torch::kFloat64) + 0.5;
  const TensorsLossFn weighted = [](const Tensors& o, const Tensors& t) {
    return ((o[0] - t[0]).pow(2) * t[1]).mean();
  };
  for (const char* schedule : {"gpipe", "1f1b"}) {
    check_exact(make_masked_mlp(), {x, mask}, {y, weights}, weighted,
                PipelineOptions().workers(3).microbatches(4).schedule(schedule).shared_inputs({1}).shared_targets({1}),
                std::string("shared, ") + schedule);
  }
}

TEST(TensorsApi, ForwardOfTensorsMatchesTheModel) {
  torch::manual_seed(4);
  auto model = make_masked_mlp();
  auto reference = testing::clone_of(model);
  StageRunner pipe(model, PipelineOptions().workers(4).microbatches(3));
  const Tensors inputs{torch::randn({7, 8}, torch::kFloat64), torch::rand({7, 8}) > 0.5};
  const Tensors out = pipe.forward(inputs);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(out[0].requires_grad());
  torch::NoGradGuard no_grad;
  EXPECT_LE((out[0] - reference_forward(reference, inputs)[0]).abs().max().item<double>(), 1e-12);
}

// Dot-product attention of the decoder's states over the encoder's memory:
// {memory [N, S, H], decoder [N, T, H]} -> {memory, tanh(W [context; decoder])}.
struct AttentionImpl : torch::nn::Cloneable<AttentionImpl>, TensorsLayer {
  explicit AttentionImpl(int64_t hidden) : hidden(hidden) { reset(); }
  void reset() override { combine = register_module("combine", torch::nn::Linear(2 * hidden, hidden)); }
  int64_t num_inputs() const override { return 2; }
  Tensors forward(Tensors t) override {
    const at::Tensor weights = torch::softmax(torch::bmm(t[1], t[0].transpose(1, 2)), -1);  // [N, T, S]
    const at::Tensor context = torch::bmm(weights, t[0]);                                   // [N, T, H]
    return {t[0], torch::tanh(combine(torch::cat({context, t[1]}, -1)))};
  }
  int64_t hidden;
  torch::nn::Linear combine{nullptr};
};
TORCH_MODULE(Attention);

// {source tokens [N, S], target tokens [N, T]} -> logits [N, T, V]. The memory
// is made by layer 1 and read by layer 4, riding through the layers between.
torch::nn::Sequential make_seq2seq() {
  torch::nn::Sequential m(OnSlot(0, torch::nn::Embedding(kV, kD)),                           // {source, target}
                          OnSlot(0, Lstm(torch::nn::LSTMOptions(kD, kH).batch_first(true))),  // {memory, target}
                          OnSlot(1, torch::nn::Embedding(kV, kD)),
                          OnSlot(1, Lstm(torch::nn::LSTMOptions(kD, kH).batch_first(true))),  // {memory, decoder}
                          Attention(kH), OnSlot(1, torch::nn::Linear(kH, kV)),
                          TensorsFunction([](Tensors t) { return Tensors{t[1]}; }, "drop the memory", 2));
  m->to(torch::kFloat64);
  return m;
}

TEST(TensorsExactness, EncoderDecoderWhoseMemoryCrossesStages) {
  // {2, 4} and {2, 3, 4}: the memory crosses two and three boundaries before
  // it is read, and its gradient comes back through stages that only pass it
  // on. {1, 5} and {1, 3, 5}: it also reaches a last stage that drops it
  // unread, which sends back no gradient for it.
  const std::vector<std::vector<int64_t>> cuts = {{3}, {2, 4}, {1, 5}, {2, 3, 4}, {1, 3, 5}};
  for (const char* schedule : kSyncSchedules) {
    for (const auto& cut : cuts) {
      for (int m : {1, 3, 4}) {
        torch::manual_seed(static_cast<int64_t>(cut.size() * 100 + cut[0] * 10 + m));
        const at::Tensor source = torch::randint(kV, {6, 5}), target = torch::randint(kV, {6, 4});
        std::string name = "cut";
        for (int64_t b : cut) {
          name += ' ';
          name += std::to_string(b);
        }
        check_exact(make_seq2seq(), {source, target}, {torch::randint(kV, {6, 4})}, lm_loss_of_first,
                    PipelineOptions().boundaries(cut).microbatches(m).schedule(schedule), where_of(schedule, name, m));
      }
    }
  }
}

// The widths a layer saw (one stage thread writes, the test reads).
struct Widths {
  std::mutex mutex;
  std::set<int64_t> seen;
};

// {tokens [N, Tmax] padded with 0, lengths [N]} -> {logits [n, width, V],
// lengths}: layer 0 cuts each micro-batch to its longest sample, so every
// tensor after it has the micro-batch's own width; layer 3 records it.
torch::nn::Sequential make_trimming_lm(const std::shared_ptr<Widths>& widths) {
  torch::nn::Sequential m(
      TensorsFunction(
          [](Tensors t) {
            t[0] = t[0].narrow(1, 0, t[1].max().item<int64_t>());
            return t;
          },
          "trim the padding", 2),
      OnSlot(0, torch::nn::Embedding(kV, kD)), OnSlot(0, Lstm(torch::nn::LSTMOptions(kD, kH).batch_first(true))),
      TensorsFunction(
          [widths](Tensors t) {
            std::lock_guard<std::mutex> lock(widths->mutex);
            widths->seen.insert(t[0].size(1));
            return t;
          },
          "record the width"),
      OnSlot(0, Lstm(torch::nn::LSTMOptions(kH, kH).batch_first(true))), OnSlot(0, torch::nn::Linear(kH, kV)));
  m->to(torch::kFloat64);
  return m;
}

// The mean over samples of each sample's mean token loss, padding masked out.
// A mean over samples, so weighting each micro-batch by n_i / N is exact.
at::Tensor per_sample_loss(const Tensors& out, const Tensors& target) {
  namespace F = torch::nn::functional;
  const at::Tensor& logits = out[0];
  const int64_t n = logits.size(0), width = logits.size(1);
  const at::Tensor labels = target[0].narrow(1, 0, width);  // the targets trimmed like the tokens
  const at::Tensor token_loss = F::cross_entropy(logits.reshape({-1, logits.size(2)}), labels.reshape({-1}),
                                                 F::CrossEntropyFuncOptions().reduction(torch::kNone));
  const at::Tensor valid = torch::arange(width).unsqueeze(0) < out[1].unsqueeze(1);
  return ((token_loss.view({n, width}) * valid).sum(1) / out[1]).mean();
}

TEST(TensorsExactness, MicrobatchesOfDifferentLengths) {
  // Reference: the unsplit model on the whole batch, trimmed to its longest
  // sample (8). That is exact: the LSTMs are causal from a zero state, so a
  // sample's outputs before its length do not depend on how much padding
  // follows, nor on the other samples; the loss masks the padding out.
  const at::Tensor lengths = torch::tensor({2, 3, 7, 4, 8, 5}, torch::kLong);
  const at::Tensor valid = torch::arange(8).unsqueeze(0) < lengths.unsqueeze(1);
  for (const char* schedule : kSyncSchedules) {
    for (int k : {2, 3}) {  // layer 3 is on stage 1 for both
      for (int m : {2, 3, 4}) {
        torch::manual_seed(k * 100 + m);
        const at::Tensor tokens = torch::randint(1, kV, {6, 8}) * valid;
        const at::Tensor labels = torch::randint(1, kV, {6, 8}) * valid;
        auto widths = std::make_shared<Widths>();
        const std::string where = where_of(schedule, "K=" + std::to_string(k), m);
        check_exact(make_trimming_lm(widths), {tokens, lengths}, {labels}, per_sample_loss,
                    PipelineOptions().workers(k).microbatches(m).schedule(schedule), where);
        // Each micro-batch crossed stage 0 -> 1 at its own width (the
        // reference's 8 is one of them).
        std::set<int64_t> expected;
        for (const auto& part : lengths.tensor_split(m)) expected.insert(part.max().item<int64_t>());
        ASSERT_GE(expected.size(), 2u);
        EXPECT_EQ(widths->seen, expected) << where;
      }
    }
  }
}

// {x, ids} -> x + table(ids): reads the integer ids stages after the input.
struct AddEmbeddingImpl : torch::nn::Cloneable<AddEmbeddingImpl>, TensorsLayer {
  AddEmbeddingImpl(int64_t n, int64_t dim) : n(n), dim(dim) { reset(); }
  void reset() override { table = register_module("table", torch::nn::Embedding(n, dim)); }
  int64_t num_inputs() const override { return 2; }
  Tensors forward(Tensors t) override { return {t[0] + table(t[1])}; }
  int64_t n, dim;
  torch::nn::Embedding table{nullptr};
};
TORCH_MODULE(AddEmbedding);

struct IdsSeen {
  std::atomic<int> calls{0}, wrong{0};  // wrong: not int64, or requiring a gradient
};

torch::nn::Sequential make_ids_model(const std::shared_ptr<IdsSeen>& seen) {
  const auto check = [seen](Tensors t) {
    ++seen->calls;
    if (t[1].scalar_type() != torch::kLong || t[1].requires_grad()) ++seen->wrong;
    return t;
  };
  torch::nn::Sequential m(OnSlot(0, torch::nn::Linear(8, 8)), OnSlot(0, torch::nn::Tanh()),
                          TensorsFunction(check, "check the ids", 2), OnSlot(0, torch::nn::Linear(8, 8)),
                          TensorsFunction(check, "check the ids", 2), AddEmbedding(10, 8), torch::nn::Linear(8, 3));
  m->to(torch::kFloat64);
  return m;
}

TEST(TensorsExactness, IntegerTensorsTravelForwardOnly) {
  // The ids cross up to three boundaries (K = 4: 0-1 | 2-3 | 4-5 | 6) as
  // int64 without a gradient; the float gradients around them stay exact.
  for (const char* schedule : kSyncSchedules) {
    for (int k = 2; k <= 4; ++k) {
      for (int m : {1, 4}) {
        torch::manual_seed(k * 100 + m);
        auto seen = std::make_shared<IdsSeen>();
        const Tensors inputs{torch::randn({6, 8}, torch::kFloat64), torch::randint(10, {6})};
        const std::string where = where_of(schedule, "K=" + std::to_string(k), m);
        check_exact(make_ids_model(seen), inputs, {torch::randn({6, 3}, torch::kFloat64)}, mse_of_first,
                    PipelineOptions().workers(k).microbatches(m).schedule(schedule), where);
        EXPECT_GT(seen->calls.load(), 0) << where;
        EXPECT_EQ(seen->wrong.load(), 0) << where;
      }
    }
  }
}

TEST(TensorsErrors, PlainLayerGivenTwoTensorsAtAStageBoundary) {
  torch::manual_seed(20);
  torch::nn::Sequential model(OnSlot(0, torch::nn::Linear(8, 8)), torch::nn::Linear(8, 3));
  model->to(torch::kFloat64);
  auto reference = testing::clone_of(model);
  StageRunner pipe(model, PipelineOptions().boundaries({1}).microbatches(2));
  const at::Tensor x = torch::randn({4, 8}, torch::kFloat64), y = torch::randn({4, 3}, torch::kFloat64);
  try {  // stage 0 passes {x, mask} on; stage 1 begins with a plain Linear
    pipe.train_step(Tensors{x, torch::ones({4, 8}, torch::kFloat64)}, Tensors{y}, mse_of_first);
    FAIL() << "expected an error";
  } catch (const PipelineError& e) {
    EXPECT_EQ(e.stage(), 1);
    EXPECT_EQ(e.microbatch(), 0);
    EXPECT_THAT(e.what(), HasSubstr("stage 1 failed in 1F0 (forward of micro-batch 0): layer 1 (torch::nn::Linear"));
    EXPECT_THAT(e.what(), HasSubstr("it takes one tensor, but 2 reach it"));
  }
  expect_recovers(pipe, reference, Tensors{x}, Tensors{y}, mse_of_first);
}

TEST(TensorsErrors, TensorsLayerGivenTheWrongNumberOfTensors) {
  torch::manual_seed(21);
  torch::nn::Sequential model(
      OnSlot(0, torch::nn::Linear(8, 8)),
      TensorsFunction([](Tensors t) { return Tensors{t[0] * t[1] + t[2]}; }, "gate and shift", 3),
      torch::nn::Linear(8, 3));
  model->to(torch::kFloat64);
  auto reference = testing::clone_of(model);
  StageRunner pipe(model, PipelineOptions().boundaries({1}).microbatches(2).schedule("gpipe"));
  const at::Tensor x = torch::randn({4, 8}, torch::kFloat64), y = torch::randn({4, 3}, torch::kFloat64);
  const std::string error = error_of<PipelineError>([&] {
    pipe.train_step(Tensors{x, torch::rand({4, 8}, torch::kFloat64)}, Tensors{y}, mse_of_first);
  });
  EXPECT_THAT(error,
              HasSubstr("layer 1 (conveyor::TensorsFunction(gate and shift)): it takes 3 tensors, but 2 reach it"));
  expect_recovers(pipe, reference,
                  Tensors{x, torch::rand({4, 8}, torch::kFloat64), torch::randn({4, 8}, torch::kFloat64)}, Tensors{y},
                  mse_of_first);
}

TEST(TensorsErrors, InputsOrTargetsOfDifferentBatchSizes) {
  torch::manual_seed(22);
  auto model = make_masked_mlp();
  auto reference = testing::clone_of(model);
  StageRunner pipe(model, PipelineOptions().workers(2).microbatches(2));
  const at::Tensor x = torch::randn({6, 8}, torch::kFloat64), y = torch::randn({6, 3}, torch::kFloat64);
  const std::string inputs = error_of<std::invalid_argument>([&] {
    pipe.train_step(Tensors{x, torch::ones({5, 8}, torch::kFloat64)}, Tensors{y}, mse_of_first);
  });
  EXPECT_THAT(inputs, HasSubstr("the input 1 has 5 samples along dimension 0"));
  EXPECT_THAT(inputs, HasSubstr("but the input 0 has 6"));
  EXPECT_THAT(error_of<std::invalid_argument>([&] {
                pipe.train_step(Tensors{x, torch::ones({6, 8}, torch::kFloat64)},
                                Tensors{y, torch::ones({4}, torch::kFloat64)}, mse_of_first);
              }),
              HasSubstr("the target 1 has 4 samples along dimension 0"));
  expect_recovers(pipe, reference, Tensors{x, torch::ones({6, 8}, torch::kFloat64)}, Tensors{y}, mse_of_first);
}

TEST(TensorsErrors, SharedInputIndexOutOfRange) {
  StageRunner pipe(make_masked_mlp(), PipelineOptions().workers(2).microbatches(2).shared_inputs({2}));
  const Tensors inputs{torch::randn({4, 8}, torch::kFloat64), torch::ones({4, 8}, torch::kFloat64)};
  EXPECT_THAT(error_of<std::invalid_argument>([&] {
                pipe.train_step(inputs, Tensors{torch::randn({4, 3}, torch::kFloat64)}, mse_of_first);
              }),
              HasSubstr("shared input 2 is not one of the 2 given"));
  EXPECT_THAT(error_of<std::invalid_argument>([&] { pipe.forward(inputs); }),
              HasSubstr("shared input 2 is not one of the 2 given"));
}

TEST(TensorsErrors, SingleTensorLossForAModelOfTwoOutputs) {
  torch::manual_seed(23);
  torch::nn::Sequential model(
      torch::nn::Linear(8, 3),
      TensorsFunction([](Tensors t) { return Tensors{t[0], t[0].tanh()}; }, "and its tanh", 1));
  model->to(torch::kFloat64);
  auto reference = testing::clone_of(model);
  StageRunner pipe(model, PipelineOptions().boundaries({1}).microbatches(2));
  const at::Tensor x = torch::randn({4, 8}, torch::kFloat64), y = torch::randn({4, 3}, torch::kFloat64);
  EXPECT_THAT(error_of<PipelineError>([&] { pipe.train_step(x, y, testing::mse); }),
              HasSubstr("the last stage returns 2 tensors, but the loss function takes one: give train_step a loss "
                        "function of Tensors"));
  EXPECT_THAT(error_of([&] { pipe.forward(x); }), HasSubstr("call forward with Tensors"));
  const TensorsLossFn both = [](const Tensors& o, const Tensors& t) {
    return testing::mse(o[0], t[0]) + testing::mse(o[1], t[0]);
  };
  expect_recovers(pipe, reference, Tensors{x}, Tensors{y}, both);
}

}  // namespace
}  // namespace conveyor
