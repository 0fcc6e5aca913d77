#pragma once
// Ranks of the multi-process tests that pass several tensors between stages
// (tests/distributed/test_distributed.cpp): a two-input model, micro-batches of different
// sequence lengths in one step, and a language model whose embedding and
// projection are tied across the two processes. The in-process references
// use the same models and data.

#include "distributed_roles.h"
#include "plugin/transport/c10d.h"

namespace conveyor::testing {

constexpr int kTiedSteps = 5;

// {x, mask} -> the mask is read in both stages and dropped at the end.
inline torch::nn::Sequential seeded_two_input() {
  torch::manual_seed(0);
  auto masked = [](Tensors t) { return Tensors{t[0] * t[1], t[1]}; };
  torch::nn::Sequential m(OnSlot(0, torch::nn::Linear(8, 8)), TensorsFunction(masked, "mask", 2),
                          OnSlot(0, torch::nn::Tanh()), OnSlot(0, torch::nn::Linear(8, 8)),
                          TensorsFunction(masked, "mask", 2),
                          TensorsFunction([](Tensors t) { return Tensors{t[0]}; }, "drop the mask", 2),
                          torch::nn::Linear(8, 3));
  m->to(torch::kFloat64);
  return m;
}

inline Tensors two_input_batch() {
  torch::manual_seed(41);
  return {torch::randn({kBatch, 8}, torch::kFloat64), (torch::rand({kBatch, 8}) > 0.3).to(torch::kFloat64)};
}

inline at::Tensor lm_loss_of_first(const Tensors& out, const Tensors& target) { return lm_loss(out[0], target[0]); }

// kMicrobatches micro-batches of 2 sequences each, of lengths 3, 7, 2 and 5.
inline std::pair<std::vector<Tensors>, std::vector<Tensors>> bucketed_batches() {
  torch::manual_seed(42);
  std::vector<Tensors> inputs, targets;
  for (int64_t length : {3, 7, 2, 5}) {
    inputs.push_back({torch::randint(kVocab, {2, length})});
    targets.push_back({torch::randint(kVocab, {2, length})});
  }
  return {inputs, targets};
}

inline torch::nn::Sequential seeded_lstm_lm() {
  torch::manual_seed(0);
  return make_lstm_lm();
}

// Embedding and output projection are one logical [kVocab, 12] weight.
inline torch::nn::Sequential seeded_tied_lm() {
  torch::manual_seed(0);
  torch::nn::Sequential m(torch::nn::Embedding(kVocab, 12),
                          FirstOutput<torch::nn::LSTM>(torch::nn::LSTMOptions(12, 12).batch_first(true)),
                          torch::nn::Linear(torch::nn::LinearOptions(12, kVocab).bias(false)));
  m->to(torch::kFloat64);
  return m;
}

inline PipelineOptions tied_lm_options() {
  return PipelineOptions().microbatches(kMicrobatches).schedule("1f1b").tied_parameters({{"0.weight", "2.weight"}});
}

inline std::pair<at::Tensor, at::Tensor> tied_lm_batch(int step) {
  torch::manual_seed(200 + step);
  return {torch::randint(kVocab, {kBatch, 6}), torch::randint(kVocab, {kBatch, 6})};
}

// A boundary of `width` float64 values a sample: 16 (a message of a few
// hundred bytes) or 70,000 (1.1 MB a micro-batch, past the 1 MiB that a
// message's first part may hold).
inline torch::nn::Sequential seeded_wide(int64_t width) {
  torch::manual_seed(0);
  torch::nn::Sequential m(torch::nn::Linear(8, width), torch::nn::Tanh(), torch::nn::Linear(width, 3));
  m->to(torch::kFloat64);
  return m;
}

// One 1F1B step of each, over a transport made here so that its counts can be
// read: "messages wire-messages" that this rank sent, and the gradients.
inline void wire_counts(Worker& w) {
  auto groups = w.groups("counts", 2, std::chrono::seconds(20));
  const Data d = global_batch(0);
  for (const int64_t width : {16, 70000}) {
    C10dTransportOptions o;
    o.worker = groups->worker();
    o.ranks = {0, 1};
    o.timeout = std::chrono::seconds(20);
    auto transport = std::make_unique<C10dTransport>(groups->pipeline(), nullptr, o);
    const C10dTransport& wire = *transport;
    StageRunner pipe(seeded_wide(width), PipelineOptions().workers(2).microbatches(kMicrobatches), o.worker,
                  std::move(transport));
    pipe.train_step(d.x, d.y, mse);
    const std::string what = "wide" + std::to_string(width);
    w.note(what, std::to_string(wire.counts().messages) + " " + std::to_string(wire.counts().wire_messages));
    write_tensors(w.file(what), grads_of(pipe.named_parameters()));
  }
  groups->barrier();
}

inline void several_tensors(Worker& w) {
  auto groups = w.groups("tensors", w.env.world_size, std::chrono::seconds(20));
  const Data d = global_batch(0);
  {
    DistributedRunner pipe(seeded_two_input(), PipelineOptions(PipelineOptions().microbatches(kMicrobatches)).distributed(link_options()), groups);
    pipe.train_step(two_input_batch(), Tensors{d.y}, mse_of_first);
    write_tensors(w.file("two-input"), grads_of(pipe.named_parameters()));
  }
  {
    DistributedRunner pipe(seeded_lstm_lm(), PipelineOptions(PipelineOptions().microbatches(kMicrobatches)).distributed(link_options()), groups);
    const auto [inputs, targets] = bucketed_batches();
    pipe.train_microbatches(inputs, targets, lm_loss_of_first);
    write_tensors(w.file("bucketed"), grads_of(pipe.named_parameters()));
  }
  {
    auto sgd = [](std::vector<at::Tensor> p) {
      return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.5).momentum(0.9));
    };
    DistributedRunner pipe(seeded_tied_lm(), PipelineOptions(tied_lm_options().optimizer(sgd)).distributed(link_options()), groups);
    for (int step = 0; step < kTiedSteps; ++step) {
      const auto [x, y] = tied_lm_batch(step);
      pipe.train_step(x, y, lm_loss);
    }
    write_tensors(w.file("tied"), values_of(pipe.named_parameters()));
  }
  groups->barrier();
  wire_counts(w);
}

}  // namespace conveyor::testing
