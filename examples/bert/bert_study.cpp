// bert_study: naive sequential model parallelism, DDG, features replay and
// PipeDream (and GPipe, 1F1B) training the small BERT of bert_pipeline on the
// masked-LM task, cut into 2, 3 and 4 stages, over a few learning rates.
// Prints the final held-out masked-LM loss and accuracy per method and number
// of stages, the divergences per learning rate, and the time per epoch.
// Run with --help for the data, the flags and what is compared.

#include "examples/bert/bert_setup.h"
#include "examples/bert/bert_train.h"
#include "examples/common/study_tables.h"
#include "plugin/conveyor.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>

namespace ex = conveyor::examples;

#ifndef CONVEYOR_BINARY_DIR  // the build defines it: trained tokenizers are cached there
#define CONVEYOR_BINARY_DIR "."
#endif

namespace {

constexpr const char* kHelp = R"(bert_study: model-parallel training methods on a small BERT, side by side.

The model and data of bert_pipeline (embeddings, encoder layers, a masked-LM
head tied to the token embedding; the fortunes, a SentencePiece tokenizer,
BERT's 15% masking) are cut into --stages stages balanced by estimated work.
Every (method, stages, learning rate) starts from the same initial weights,
sees the same mini-batches with the same masks in the same order, and reports
the held-out (valid) masked-LM loss and accuracy after its last epoch.

Methods: sequential (naive model parallelism, one mini-batch at a time), gpipe
and 1f1b (synchronous: a mini-batch is split into --sync-microbatches
micro-batches), and the asynchronous ddg (delayed gradients), fr (features
replay) and pipedream (weight stashing), which update every stage after
every mini-batch, --microbatches mini-batches per pipeline step. Every method
makes one update per mini-batch of --batch sequences, the same updates per
epoch, under the same learning-rate schedule (AdamW, weight decay 0.01,
linear warm-up over --warmup of the updates, then linear decay to 0, no
clipping). The asynchronous methods cannot keep a tied weight: their decoder
starts as a copy of the token embedding and is trained on its own.
A run diverges when a loss or gradient becomes non-finite
(conveyor::DivergenceError) or an epoch's mean train loss exceeds
--diverge-loss (default ln V, a uniform guess); it stops and counts as
diverged. Here dropout defaults to 0, so every run is deterministic, and
masking to pieces (--masking token), which a short run learns sooner.

Flags (--flag VALUE or --flag=VALUE; lists are comma-separated):
  --stages LIST         numbers of stages, each at most layers+2 (default 2,3,4)
  --methods LIST        of sequential,gpipe,1f1b,ddg,fr,pipedream
                        (default sequential,ddg,fr,pipedream)
  --lrs LIST            peak learning rates (default 0.002,0.008,0.032)
  --epochs N            (default 3)
  --batch N             sequences per mini-batch, i.e. per update (default 16)
  --microbatches N      mini-batches per step, asynchronous methods (default 8)
  --sync-microbatches N micro-batches per mini-batch, gpipe and 1f1b (default 4)
  --train-limit N       a fixed subset of N train sequences (default 2048; 0: all)
  --eval-limit N        a fixed subset of N valid sequences (default 512; 0: all)
  --warmup F            share of the updates spent warming up (default 0.05)
  --diverge-loss X      epoch train loss counted as divergence (default ln V)
  --seed N              initial weights, batch order and masks (default 1)
  --threads N           intra-op threads per stage (default cores / stages)
)";

constexpr const char* kHelpEnd = R"(
Time per epoch is the wall time of training; every stage is a thread, so on a
CPU with fewer cores than stages it shows overheads, not the speed-ups of one
device per stage. Results are deterministic for a given --seed (dropout 0).
Exit status: 0 when every run ended (diverged or not), 1 on a failure, 2 for
invalid flags or missing data.
)";

struct Config {
  ex::BertSetup setup = ex::default_setup(CONVEYOR_BINARY_DIR "/bert-tokenizer");
  ex::BertTraining training;
  std::vector<int64_t> stages = {2, 3, 4};
  std::vector<std::string> methods = {"sequential", "ddg", "fr", "pipedream"};
  std::vector<double> lrs = {0.002, 0.008, 0.032};
  int64_t sync_microbatches = 4;
};

bool parse_args(int argc, char** argv, Config& c) {
  constexpr int64_t kBig = 1'000'000'000;
  ex::BertTraining& t = c.training;
  t.epochs = 3, t.batch = 16, t.microbatches = 8, t.train_limit = 2048, t.eval_limit = 512, t.warmup = 0.05;
  c.setup.model.dropout = 0;
  c.setup.masking.whole_word = false;  // pieces: a model this small learns from them sooner
  ex::Flags flags;
  ex::add_setup_flags(flags, c.setup);
  flags.integer("--epochs", &t.epochs, 1, kBig).integer("--batch", &t.batch, 1, kBig);
  flags.integer("--microbatches", &t.microbatches, 1, 4096);
  flags.integer("--sync-microbatches", &c.sync_microbatches, 1, 4096);
  flags.integer("--train-limit", &t.train_limit, 0, kBig).integer("--eval-limit", &t.eval_limit, 0, kBig);
  flags.real("--warmup", &t.warmup, 0, 1).real("--diverge-loss", &t.diverge_loss, 0, 1e9);
  flags.integer("--seed", &t.seed, 0, kBig).integer("--threads", &t.threads, 1, 1024);
  flags.on("--stages", [&c](const std::string& flag, const std::string& value) {
    c.stages.clear();
    for (const auto& s : ex::split_list(flag, value)) c.stages.push_back(ex::parse_int(flag, s, 1, 64));
  });
  flags.on("--lrs", [&c](const std::string& flag, const std::string& value) {
    c.lrs.clear();
    for (const auto& s : ex::split_list(flag, value)) c.lrs.push_back(ex::parse_real(flag, s, 1e-9, 1e3));
  });
  flags.on("--methods", [&c](const std::string& flag, const std::string& value) {
    c.methods = ex::split_list(flag, value);
    const auto& names = conveyor::schedules::schedule_names();
    for (const auto& m : c.methods) {
      if (std::find(names.begin(), names.end(), m) == names.end()) {
        throw ex::UsageError(flag + ": unknown method '" + m + "' (sequential, gpipe, 1f1b, ddg, fr, pipedream)");
      }
    }
  });
  if (!flags.parse(argc, argv)) return false;
  for (int64_t k : c.stages) {
    if (k > c.setup.model.layers + 2) {
      throw ex::UsageError("--stages " + std::to_string(k) + ": the model has only " +
                           std::to_string(c.setup.model.layers + 2) + " layers (embeddings, encoders, head)");
    }
    if (k > t.microbatches) {
      throw ex::UsageError("--microbatches (" + std::to_string(t.microbatches) + ") must be at least the " +
                           std::to_string(k) + " stages: the asynchronous pipelines must fill");
    }
  }
  if (c.sync_microbatches > t.batch) throw ex::UsageError("--sync-microbatches cannot exceed --batch");
  return true;
}

ex::Run run_one(const Config& c, const ex::MlmData& data, const std::string& method, int64_t stages, double lr) {
  ex::BertTraining t = c.training;
  t.schedule = method;
  t.stages = stages;
  t.lr = lr;
  t.round = c.training.microbatches;  // the same updates per epoch for every method
  const bool async = !conveyor::schedules::make_schedule(method, 1, 1).synchronous();
  t.microbatches = async ? c.training.microbatches : method == "sequential" ? 1 : c.sync_microbatches;
  const ex::BertOutcome out = ex::train_bert(data, c.setup.model, t);
  ex::Run run;
  run.method = method;
  run.stages = stages;
  run.lr = lr;
  run.diverged_epoch = out.diverged_epoch;
  run.why = out.why;
  double seconds = 0;
  for (const auto& e : out.epochs) seconds += e.seconds;
  if (!out.epochs.empty()) {
    run.best_epoch = out.epochs.back().epoch;
    run.best_accuracy = out.epochs.back().eval_accuracy;
    run.eval_loss = out.epochs.back().eval_loss;
    run.last_loss = out.epochs.back().train_loss;
    run.seconds_per_epoch = seconds / static_cast<double>(out.epochs.size());
  }
  std::cout << ex::pad(method, 11) << ex::pad("stages " + std::to_string(stages), 10)
            << ex::pad("lr " + ex::shortest(lr), 10);
  if (run.diverged()) {
    std::cout << "DIVERGED in epoch " << run.diverged_epoch << ": " << run.why << "\n" << std::flush;
  } else {
    std::cout << "valid masked-LM loss " << ex::fixed(out.initial_eval_loss, 3) << " -> " << ex::fixed(run.eval_loss, 3)
              << ", accuracy " << ex::fixed(run.best_accuracy, 2) << "%, last epoch's train loss "
              << ex::fixed(run.last_loss, 3) << ", " << ex::fixed(run.seconds_per_epoch, 2) << " s/epoch\n"
              << std::flush;
  }
  return run;
}

int run(Config& c) {
  const auto started = std::chrono::steady_clock::now();
  const ex::MlmData data = ex::load_setup_data(c.setup, std::cout);
  const ex::BertConfig& m = c.setup.model;
  const ex::BertTraining& t = c.training;
  std::cout << "model: " << ex::describe_model(m) << "\ntraining: " << t.epochs << " epochs on "
            << (t.train_limit ? std::to_string(t.train_limit) : "all")
            << " train sequences, mini-batches of " << t.batch << ", asynchronous methods " << t.microbatches
            << " mini-batches per step, gpipe/1f1b " << c.sync_microbatches << " micro-batches per mini-batch; "
            << "held-out: " << (t.eval_limit ? std::to_string(t.eval_limit) : "all") << " valid sequences; seed "
            << t.seed << "\n\n"
            << std::flush;
  std::vector<ex::Run> runs;
  for (const auto& method : c.methods) {
    for (int64_t k : c.stages) {
      for (double lr : c.lrs) runs.push_back(run_one(c, data, method, k, lr));
    }
  }
  ex::StudyMetric metric{
      "Final valid masked-LM loss and accuracy at the learning rate of the lowest loss, diverged runs left out:",
      [](const ex::Run& a, const ex::Run& b) { return a.eval_loss < b.eval_loss; },
      [](const ex::Run& r) {
        return ex::fixed(r.eval_loss, 3) + " " + ex::fixed(r.best_accuracy, 1) + "% [" + ex::shortest(r.lr) + "]";
      },
      22};
  ex::print_tables(c.stages, c.lrs, c.methods, runs, metric);
  std::cout << "\ntotal time "
            << ex::fixed(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), 1)
            << " s\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config config;
  return ex::run_main(
      "bert_study", std::string(kHelp) + "\n" + ex::kSetupFlagsHelp + kHelpEnd,
      [&] { return parse_args(argc, argv, config); }, [&] { return run(config); });
}
