#include "examples/bert/bert_train.h"

#include "examples/common/digits_data.h"
#include "examples/common/flags.h"
#include "examples/common/training_flags.h"
#include "ops/swap.h"
#include "plugin/conveyor.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <sstream>
#include <thread>

namespace conveyor::examples {

namespace {

constexpr uint64_t kEvalMaskSeed = 20190621;  // the same held-out predictions for every run

// The first `limit` sequences of a seeded shuffle (all when limit is 0 or larger).
Sequences subset(const Sequences& all, int64_t limit, uint64_t seed) {
  if (limit <= 0 || limit >= static_cast<int64_t>(all.size())) return all;
  Sequences out;
  for (int64_t i : seeded_permutation(static_cast<int64_t>(all.size()), seed)) {
    if (static_cast<int64_t>(out.size()) == limit) break;
    out.push_back(all[i]);
  }
  return out;
}

// Scores `seqs` in forward passes of about `chunk` sequences (at least chunk each).
MlmScore evaluate(Pipeline& pipe, const Sequences& seqs, const SubwordTokenizer& t, const Masking& masking,
                  int64_t chunk) {
  pipe.eval();
  torch::NoGradGuard no_grad;
  MlmScore total;
  const auto n = static_cast<int64_t>(seqs.size());
  const int64_t chunks = std::max<int64_t>(1, n / chunk);
  for (int64_t c = 0; c < chunks; ++c) {
    std::vector<int64_t> which;
    for (int64_t i = c * n / chunks; i < (c + 1) * n / chunks; ++i) which.push_back(i);
    const MlmBatch b = make_mlm_batch(seqs, which, t, masking, kEvalMaskSeed);
    const MlmScore s = mlm_score(pipe.forward(Tensors{b.tokens, b.padding})[0], b.labels);
    total.loss_sum += s.loss_sum;
    total.correct += s.correct;
    total.predictions += s.predictions;
  }
  pipe.train();
  return total;
}

double mean_loss(const MlmScore& s) { return s.loss_sum / static_cast<double>(std::max<int64_t>(1, s.predictions)); }
double accuracy(const MlmScore& s) {
  return 100.0 * static_cast<double>(s.correct) / static_cast<double>(std::max<int64_t>(1, s.predictions));
}

}  // namespace

BertOutcome train_bert(const MlmData& data, const BertConfig& config, const BertTraining& t, const BertHooks& hooks) {
  const auto note = [&](const std::string& line) {
    if (hooks.note) hooks.note(line);
  };
  const int stages = static_cast<int>(t.stages), microbatches = static_cast<int>(t.microbatches);
  const bool async = !schedules::make_schedule(t.schedule, stages, std::max(stages, microbatches)).synchronous();
  const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  at::set_num_threads(static_cast<int>(t.threads > 0 ? t.threads : std::max<int64_t>(1, cores / t.stages)));
  torch::manual_seed(static_cast<uint64_t>(t.seed));  // the same initial weights for every run
  BertModel model = make_bert(config);
  if (t.fused) {
    std::string report = swap_fused_ops(model.layers.ptr()).to_string();
    while (report.ends_with('\n')) report.pop_back();
    note("fused ops: " + report);
    note("on a CPU the fused attention runs its reference path; while training with dropout it takes "
         "MultiheadAttention's math path (the fused kernel has no dropout)");
  }

  BertOutcome out;
  const Sequences train = subset(data.train, t.train_limit, 7), eval = subset(data.valid, t.eval_limit, 11);
  out.train_sequences = static_cast<int64_t>(train.size());
  out.eval_sequences = static_cast<int64_t>(eval.size());
  if (out.eval_sequences < t.microbatches) {
    throw std::invalid_argument("the held-out split (" + std::to_string(out.eval_sequences) +
                                " sequences) is smaller than the number of micro-batches");
  }
  const int64_t round = t.round > 0 ? t.round : t.microbatches;
  out.updates_per_epoch = out.train_sequences / (round * t.batch) * round;
  if (out.updates_per_epoch == 0) {
    throw std::invalid_argument("one epoch needs at least " + std::to_string(round * t.batch) + " train sequences (" +
                                std::to_string(round) + " x a mini-batch of " + std::to_string(t.batch) + "), have " +
                                std::to_string(out.train_sequences));
  }
  const int64_t per_step = async ? t.microbatches : 1;  // updates per train_step
  const int64_t total = out.updates_per_epoch * t.epochs;
  const auto warmup = static_cast<int64_t>(std::llround(t.warmup * static_cast<double>(total)));
  auto options = PipelineOptions()
                     .workers(stages)
                     .microbatches(microbatches)
                     .schedule(t.schedule)
                     .boundaries(balanced_boundaries(model.costs, stages))
                     .trace(false)
                     .optimizer([lr = t.lr, wd = t.weight_decay](std::vector<at::Tensor> p) {
                       return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(lr).weight_decay(wd));
                     })
                     .lr_schedule([lr = t.lr, warmup, total](int64_t n) {
                       if (n < warmup) return lr * static_cast<double>(n + 1) / static_cast<double>(warmup);
                       return lr * std::max(0.0, 1.0 - static_cast<double>(n - warmup) /
                                                           static_cast<double>(std::max<int64_t>(1, total - warmup)));
                     })
                     .lr_schedule_unit(async ? UpdateUnit::kMicrobatch : UpdateUnit::kBatch);
  if (t.clip > 0) options.clip_grad_norm(t.clip);
  options.autocast(autocast_dtype("--autocast", t.autocast));
  if (!async) {
    options.tied_parameters({model.tied});
  } else {
    note("note: " + t.schedule + " steps each stage's weights on their own, so the decoder is untied from the token "
         "embedding: it starts as a copy and is trained as a separate weight");
  }
  const auto loss_fn = [](const Tensors& o, const Tensors& target) {
    return mlm_loss(o[0], target[0].to(o[0].device()));
  };
  if (t.plan == "auto") {  // profiled on the first micro-batch's sequences
    std::vector<int64_t> first(static_cast<size_t>(std::max<int64_t>(1, t.batch / t.microbatches)));
    std::iota(first.begin(), first.end(), 0);
    const MlmBatch b = make_mlm_batch(train, first, data.tokenizer, t.masking, 1);
    const ProfileOptions timing = ProfileOptions().optimizer(optimizer_factory(options));  // AdamW's step priced too
    options.profile(std::make_shared<ModelProfile>(
        profile_model(model.layers, {b.tokens, b.padding}, {b.labels}, loss_fn, timing)))
        .optimizer_state_per_weight(2);  // AdamW
    options.boundaries({});  // the search chooses the cut
    options.plan(PlanMode::kAuto).max_workers(stages).memory_budget(t.memory_budget << 20);
  }
  Pipeline pipe(model.layers, {.options = options, .batch_size = t.batch});
  if (t.plan == "auto") {
    std::string text = "--plan auto: " + pipe.plan_text();
    while (text.ends_with('\n')) text.pop_back();
    note(text);
  }
  std::string plan = "stages:";
  for (const auto& s : pipe.split().stages) {
    plan += " [";
    for (int64_t i = s.begin; i < s.end; ++i) plan += (i == s.begin ? "" : ", ") + model.names[i];
    plan += "]";
  }
  note(plan);

  const int64_t chunk = std::max<int64_t>(64, t.microbatches);
  const MlmScore before = evaluate(pipe, eval, data.tokenizer, t.masking, chunk);
  out.initial_eval_loss = mean_loss(before);
  out.initial_eval_accuracy = accuracy(before);
  const double diverge_loss = t.diverge_loss > 0 ? t.diverge_loss : std::log(static_cast<double>(config.vocab));
  int64_t done = 0;
  double pieces = 0, seconds = 0;
  for (int64_t epoch = 1; epoch <= t.epochs && !out.diverged(); ++epoch) {
    const uint64_t epoch_seed = static_cast<uint64_t>(t.seed) * 1000003 + static_cast<uint64_t>(epoch);
    const auto order = seeded_permutation(out.train_sequences, epoch_seed);
    const auto t0 = std::chrono::steady_clock::now();
    double loss_sum = 0;
    try {
      for (int64_t s = 0; s < out.updates_per_epoch / per_step; ++s) {
        const std::vector<int64_t> take(order.begin() + s * per_step * t.batch,
                                        order.begin() + (s + 1) * per_step * t.batch);
        const MlmBatch b = make_mlm_batch(train, take, data.tokenizer, t.masking, epoch_seed);
        const double loss = pipe.train_step({b.tokens, b.padding}, {b.labels}, loss_fn).loss;
        loss_sum += static_cast<double>(per_step) * loss;
        done += per_step;
        pieces += static_cast<double>(b.padding.logical_not().sum().item<int64_t>());
        if (hooks.step) {
          const double elapsed = seconds + std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          hooks.step(done, total, loss, pieces / elapsed);
        }
      }
    } catch (const DivergenceError& e) {
      out.why = "a non-finite loss or gradient on stage " + std::to_string(e.stage());
    }
    EpochReport r;
    r.epoch = epoch;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    seconds += r.seconds;
    r.train_loss = loss_sum / static_cast<double>(out.updates_per_epoch);
    if (out.why.empty() && !(r.train_loss <= diverge_loss)) {
      out.why = "mean train loss " + fixed(r.train_loss, 2) + " > " + fixed(diverge_loss, 2) + " (ln V)";
    }
    if (!out.why.empty()) {
      out.diverged_epoch = epoch;
      break;
    }
    const MlmScore s = evaluate(pipe, eval, data.tokenizer, t.masking, chunk);
    r.eval_loss = mean_loss(s);
    r.eval_accuracy = accuracy(s);
    out.epochs.push_back(r);
    if (hooks.epoch) hooks.epoch(r);
  }
  if (t.final_test && !out.diverged()) {
    const MlmScore s = evaluate(pipe, data.test, data.tokenizer, t.masking, chunk);
    out.test_loss = mean_loss(s);
    out.test_accuracy = accuracy(s);
  }
  return out;
}

}  // namespace conveyor::examples
