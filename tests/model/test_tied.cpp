// Tied weights across stages: a language model whose output projection is its
// input embedding. In a pipeline the two layers live on different stages, so
// the weight is held twice ("0.weight" on the first stage, "3.weight" on the
// last) and declared one with PipelineOptions::tied_parameters. The reference
// is the unsplit model written the usual way: one tensor used twice.
#include "error_of.h"
#include "test_models.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;
using testing::error_of;

using testing::kSyncSchedules;
constexpr int64_t kDim = 8;
const std::vector<std::vector<std::string>> kTie = {{"0.weight", "3.weight"}};

// Embedding [V, D] -> LSTM -> Linear -> projection [V, D]: 4 layers, so every
// uniform cut with K >= 2 puts layer 0 on stage 0 and layer 3 on stage K-1.
torch::nn::Sequential make_tied_lm() {
  torch::nn::Sequential m(torch::nn::Embedding(testing::kVocab, kDim),
                          FirstOutput<torch::nn::LSTM>(torch::nn::LSTMOptions(kDim, kDim).batch_first(true)),
                          torch::nn::Linear(kDim, kDim),
                          torch::nn::Linear(torch::nn::LinearOptions(kDim, testing::kVocab).bias(false)));
  m->to(torch::kFloat64);
  return m;
}

// The unsplit tied model: a clone's layers 0-2, then logits from the
// embedding's own weight; the clone's layer 3 is never used. Cloned before the
// pipeline is built, so its embedding starts from the model's "0.weight",
// which is the value the pipeline gives both copies.
struct TiedReference {
  explicit TiedReference(const torch::nn::Sequential& model) : layers(testing::clone_of(model)) {}

  at::Tensor forward(const at::Tensor& tokens) {
    auto& embedding = layers->at<torch::nn::EmbeddingImpl>(0);
    at::Tensor h = layers->at<FirstOutputImpl<torch::nn::LSTM>>(1).forward(embedding.forward(tokens));
    h = layers->at<torch::nn::LinearImpl>(2).forward(h);
    return torch::nn::functional::linear(h, embedding.weight);
  }
  // What a pipeline parameter stands for here: both copies are the embedding.
  at::Tensor counterpart(const std::string& name) const {
    return *layers->named_parameters().find(name == "3.weight" ? "0.weight" : name);
  }
  std::vector<at::Tensor> parameters() const {
    std::vector<at::Tensor> params;
    for (const auto& p : layers->named_parameters()) {
      if (p.key() != "3.weight") params.push_back(p.value());
    }
    return params;
  }

  torch::nn::Sequential layers;
};

at::Tensor param(const StageRunner& pipe, const std::string& name) {
  for (const auto& [n, p] : pipe.named_parameters()) {
    if (n == name) return p;
  }
  ADD_FAILURE() << "the pipeline has no parameter " << name;
  return at::Tensor();
}

// Both copies' gradient is the embedding's in the reference (the sum of its
// two uses); every other parameter's is its own.
void expect_reference_grads(const StageRunner& pipe, const TiedReference& ref, const std::string& where) {
  for (const auto& [name, p] : pipe.named_parameters()) {
    const at::Tensor r = ref.counterpart(name);
    ASSERT_TRUE(p.grad().defined()) << where << ": no gradient for " << name;
    ASSERT_TRUE(r.grad().defined()) << where << ": no reference gradient for " << name;
    EXPECT_LE((p.grad() - r.grad()).abs().max().item<double>(), 1e-10) << where << ": gradient of " << name;
  }
}

// The copies are bit-identical, and every weight equals the reference's.
void expect_reference_values(const StageRunner& pipe, const TiedReference& ref, const std::string& where) {
  EXPECT_TRUE(torch::equal(param(pipe, "0.weight"), param(pipe, "3.weight"))) << where << ": the copies differ";
  for (const auto& [name, p] : pipe.named_parameters()) {
    EXPECT_LE((p - ref.counterpart(name)).abs().max().item<double>(), 1e-10) << where << ": " << name;
  }
}

struct Batch {
  at::Tensor input, target;
};

Batch lm_batch(int64_t n = 6, int64_t seq = 5) {
  return {torch::randint(testing::kVocab, {n, seq}), torch::randint(testing::kVocab, {n, seq})};
}

std::unique_ptr<torch::optim::Optimizer> momentum_sgd(std::vector<at::Tensor> params) {
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
}

TEST(TiedParameters, GradientsEqualTheUnsplitTiedModel) {
  // K = 1 ties two parameters of one stage; K >= 2 puts them on different
  // stages. 6 samples in 4 micro-batches: 2, 2, 1, 1.
  for (const char* schedule : kSyncSchedules) {
    for (int k = 1; k <= 4; ++k) {
      for (int m : {1, 3, 4}) {
        torch::manual_seed(k * 100 + m);
        auto model = make_tied_lm();
        TiedReference ref(model);
        const Batch b = lm_batch();
        const at::Tensor ref_loss = testing::lm_loss(ref.forward(b.input), b.target);
        ref_loss.backward();
        StageRunner pipe(model, PipelineOptions().workers(k).microbatches(m).schedule(schedule).tied_parameters(kTie));
        EXPECT_EQ(pipe.tied_parameters(), kTie);
        const StepResult r = pipe.train_step(b.input, b.target, testing::lm_loss);
        const std::string where = std::string(schedule) + " K=" + std::to_string(k) + " M=" + std::to_string(m);
        expect_reference_grads(pipe, ref, where);
        EXPECT_TRUE(torch::equal(param(pipe, "0.weight").grad(), param(pipe, "3.weight").grad())) << where;
        EXPECT_NEAR(r.loss, ref_loss.item<double>(), 1e-10) << where;
      }
    }
  }
}

TEST(TiedParameters, PipelinesOwnSgdKeepsTheCopiesIdentical) {
  // Each stage's optimizer keeps its own momentum for its copy; the same
  // summed gradient every step keeps those buffers, and so the copies, equal.
  for (const char* schedule : {"gpipe", "1f1b"}) {
    torch::manual_seed(5);
    auto model = make_tied_lm();
    TiedReference ref(model);
    auto ref_opt = momentum_sgd(ref.parameters());
    StageRunner pipe(model, PipelineOptions()
                             .workers(3)
                             .microbatches(3)
                             .schedule(schedule)
                             .tied_parameters(kTie)
                             .optimizer(momentum_sgd));
    for (int step = 0; step < 5; ++step) {
      const Batch b = lm_batch();
      pipe.train_step(b.input, b.target, testing::lm_loss);
      ref_opt->zero_grad();
      testing::lm_loss(ref.forward(b.input), b.target).backward();
      ref_opt->step();
    }
    expect_reference_values(pipe, ref, std::string(schedule) + ", pipeline's SGD, after 5 steps");
  }
}

TEST(TiedParameters, CallersAdamKeepsTheCopiesIdentical) {
  // The caller's optimizer sees the copies as two parameters with two Adam
  // states; fed the same gradient, they stay equal bit for bit.
  for (const char* schedule : {"gpipe", "1f1b"}) {
    torch::manual_seed(6);
    auto model = make_tied_lm();
    TiedReference ref(model);
    torch::optim::Adam ref_opt(ref.parameters(), torch::optim::AdamOptions(0.01));
    StageRunner pipe(model, PipelineOptions().workers(4).microbatches(4).schedule(schedule).tied_parameters(kTie));
    torch::optim::Adam opt(pipe.parameters(), torch::optim::AdamOptions(0.01));
    for (int step = 0; step < 5; ++step) {
      const Batch b = lm_batch();
      opt.zero_grad();
      pipe.train_step(b.input, b.target, testing::lm_loss);
      opt.step();
      ref_opt.zero_grad();
      testing::lm_loss(ref.forward(b.input), b.target).backward();
      ref_opt.step();
    }
    expect_reference_values(pipe, ref, std::string(schedule) + ", caller's Adam, after 5 steps");
  }
}

TEST(TiedParameters, GradientsAccumulateOverStepsLikeTheUnsplitModel) {
  // train_step adds to .grad as loss.backward() does, so two steps without
  // zeroing (gradient accumulation) give the sum of both batches' gradients;
  // for the copies too: re-summing copies that already hold the first step's
  // sum would count that step twice.
  torch::manual_seed(7);
  auto model = make_tied_lm();
  TiedReference ref(model);
  StageRunner pipe(model, PipelineOptions().workers(2).microbatches(2).schedule("1f1b").tied_parameters(kTie));
  for (int step = 0; step < 2; ++step) {
    const Batch b = lm_batch();
    pipe.train_step(b.input, b.target, testing::lm_loss);
    testing::lm_loss(ref.forward(b.input), b.target).backward();
  }
  expect_reference_grads(pipe, ref, "two steps accumulated");
}

TEST(TiedParameters, LaterCopiesTakeTheFirstsValueWhenBuilt) {
  torch::manual_seed(8);
  auto model = make_tied_lm();
  const at::Tensor first = model->named_parameters()["0.weight"].detach().clone();
  ASSERT_FALSE(torch::equal(first, model->named_parameters()["3.weight"]));  // Embedding and Linear init differ
  StageRunner pipe(model, PipelineOptions().workers(2).tied_parameters(kTie));
  EXPECT_TRUE(torch::equal(param(pipe, "0.weight"), first));
  EXPECT_TRUE(torch::equal(param(pipe, "3.weight"), first));
  // The model's own layers are the pipeline's: the user's model sees it too.
  EXPECT_TRUE(torch::equal(model->named_parameters()["3.weight"], first));
  // A group declared in another order is reported in stage order.
  StageRunner reversed(make_tied_lm(), PipelineOptions().workers(2).tied_parameters({{"3.weight", "0.weight"}}));
  EXPECT_EQ(reversed.tied_parameters(), kTie);
}

TEST(TiedParameters, BadDeclarationsAreRefused) {
  const auto model = make_tied_lm();
  // The projection has no bias: a plausible slip, named in the message.
  EXPECT_THAT(error_of<std::invalid_argument>([&] {
                StageRunner(model, PipelineOptions().workers(2).tied_parameters({{"0.weight", "3.bias"}}));
              }),
              HasSubstr("tied_parameters names '3.bias', which is no parameter of the model"));
  // [V, D] and [D, D] cannot be one parameter.
  const std::string shapes = error_of<std::invalid_argument>([&] {
    StageRunner(model, PipelineOptions().workers(2).tied_parameters({{"0.weight", "2.weight"}}));
  });
  EXPECT_THAT(shapes, HasSubstr("'2.weight'"));
  EXPECT_THAT(shapes, HasSubstr("differ in shape or dtype"));
  // An asynchronous schedule steps each stage on its own after every
  // micro-batch: the copies would drift apart.
  for (const char* schedule : {"pipedream", "ddg", "fr"}) {
    EXPECT_THAT(error_of<std::invalid_argument>([&] {
                  StageRunner(model, PipelineOptions()
                                      .workers(2)
                                      .microbatches(4)
                                      .schedule(schedule)
                                      .optimizer(momentum_sgd)
                                      .tied_parameters(kTie));
                }),
                HasSubstr("tied parameters need a synchronous schedule"))
        << schedule;
  }
}

// A projection that reads another layer's weight tensor: how weights are
// tied in one process, which cannot hold when the layers are on two stages
// (each stage's tensors live on its own device).
struct ProjectWithImpl : torch::nn::Module {
  explicit ProjectWithImpl(const at::Tensor& shared) : weight(register_parameter("weight", shared)) {}
  at::Tensor forward(const at::Tensor& h) { return torch::nn::functional::linear(h, weight); }
  at::Tensor weight;
};
TORCH_MODULE(ProjectWith);

TEST(TiedParameters, OneTensorInLayersOfTwoStagesIsRefused) {
  torch::nn::Embedding embedding(testing::kVocab, kDim);
  torch::nn::Sequential model(embedding,
                              FirstOutput<torch::nn::LSTM>(torch::nn::LSTMOptions(kDim, kDim).batch_first(true)),
                              torch::nn::Linear(kDim, kDim), ProjectWith(embedding->weight));
  const std::string error = error_of<std::invalid_argument>([&] { StageRunner(model, PipelineOptions().workers(2)); });
  EXPECT_THAT(error, HasSubstr("'3.weight' is the same tensor as '0.weight'"));
  EXPECT_THAT(error, HasSubstr("tied_parameters({{\"0.weight\", \"3.weight\"}})"));
  // Within one stage the tensor is simply used twice.
  EXPECT_NO_THROW(StageRunner(model, PipelineOptions().workers(1)));
}

TEST(TiedParameters, ClippingCountsATiedParameterOnceAsTheUnsplitModelDoes) {
  // The pipeline's clip: the norm over every parameter with the tied one
  // counted once (its copies hold the same summed gradient), then both copies
  // scaled alike; equal to clip_grad_norm_ over the unsplit model's
  // parameters, for 2 and inf, with the pipeline's optimizer and with the
  // caller's (Pipeline::clip_grad_norm).
  for (const char* schedule : kSyncSchedules) {
    for (int k = 2; k <= 4; ++k) {
      for (double norm_type : {2.0, std::numeric_limits<double>::infinity()}) {
        const std::string where = c10::str(schedule, " K=", k, " norm ", norm_type);
        torch::manual_seed(k * 10);
        auto model = make_tied_lm();
        TiedReference ref(model);
        auto ref_opt = std::make_unique<torch::optim::SGD>(ref.parameters(), torch::optim::SGDOptions(1.0));
        StageRunner pipe(model, PipelineOptions()
                                 .workers(k)
                                 .microbatches(3)
                                 .schedule(schedule)
                                 .tied_parameters(kTie)
                                 .clip_grad_norm(0.05)
                                 .clip_norm_type(norm_type)
                                 .optimizer([](std::vector<at::Tensor> p) {
                                   return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(1.0));
                                 }));
        for (int step = 0; step < 2; ++step) {
          const Batch b = lm_batch();
          const StepResult r = pipe.train_step(b.input, b.target, testing::lm_loss);
          ref_opt->zero_grad();
          testing::lm_loss(ref.forward(b.input), b.target).backward();
          const double norm = torch::nn::utils::clip_grad_norm_(ref.parameters(), 0.05, norm_type);
          ref_opt->step();
          EXPECT_TRUE(r.stepped) << where;
          EXPECT_NEAR(r.grad_norm, norm, 1e-10) << where;
          EXPECT_GT(norm, 0.05) << where << ": the test must clip";
          expect_reference_values(pipe, ref, where + " step " + std::to_string(step));
        }
        // The caller's optimizer: the same clip on the gradients it steps.
        torch::manual_seed(k * 10 + 1);
        auto own = make_tied_lm();
        TiedReference own_ref(own);
        StageRunner caller(own, PipelineOptions().workers(k).microbatches(3).schedule(schedule).tied_parameters(kTie));
        const Batch b = lm_batch();
        caller.train_step(b.input, b.target, testing::lm_loss);
        testing::lm_loss(own_ref.forward(b.input), b.target).backward();
        const double expected = torch::nn::utils::clip_grad_norm_(own_ref.parameters(), 0.05, norm_type);
        EXPECT_NEAR(caller.clip_grad_norm(0.05, norm_type), expected, 1e-10) << where;
        expect_reference_grads(caller, own_ref, where + " (caller's optimizer)");
      }
    }
  }
}

}  // namespace
}  // namespace conveyor
