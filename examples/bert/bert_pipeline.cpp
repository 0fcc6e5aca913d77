// bert_pipeline: trains a small BERT (3 encoder layers) on the masked-language
// model task as a pipeline of stages on English text, and fails (exit 1) if
// the held-out masked-LM loss does not fall.
// Run with --help for what it does, where its data comes from and its flags.

#include "examples/bert/bert_setup.h"
#include "examples/bert/bert_train.h"
#include "examples/common/progress.h"
#include "plugin/conveyor.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>

namespace ex = conveyor::examples;

#ifndef CONVEYOR_BINARY_DIR  // the build defines it: trained tokenizers are cached there
#define CONVEYOR_BINARY_DIR "."
#endif

namespace {

constexpr const char* kHelp = R"(bert_pipeline: train a small BERT as a pipeline on the masked-LM task.

The model, embeddings -> 3 encoder layers (conveyor::EncoderLayer) -> masked-LM
head whose decoder is tied to the token embedding, is cut into --stages stages
(balanced by estimated work), each run by its own thread. Hidden states and
the padding mask cross every stage boundary; attention ignores the pads.
Data: the English quotations of Debian's 'fortunes' package, split by a hash
of each fortune into train / valid / test (about 90/5/5); a SentencePiece
unigram tokenizer is trained on the train split on first use and cached.
Each fortune becomes [CLS] pieces [SEP] (longer ones several sequences), and
BERT's masking picks 15% of the words (or pieces) to predict, shown as
[MASK] 80% of the time, a random piece 10%, unchanged 10%. The loss is the
mean cross-entropy over the predicted positions of a micro-batch.
Training: AdamW (weight decay 0.01), linear warm-up then linear decay to 0,
no gradient clipping. Synchronous schedules (sequential, gpipe, 1f1b) split
each mini-batch of --batch sequences into --microbatches micro-batches and
keep the decoder tied; asynchronous ones (pipedream, ddg, fr) update every
stage after each mini-batch, run --microbatches of them per pipeline step,
and untie the decoder (it starts as a copy of the embedding), since they
step each stage's copy on its own. --fused-ops on swaps in
conveyor::FusedMultiheadAttention; on a CPU it runs its reference path.
It reports the valid masked-LM loss and accuracy before training and after
every epoch, the test ones at the end, and exits with 1 unless the valid loss
fell by at least --require-drop nats.

Flags (--flag VALUE or --flag=VALUE):
  --stages N          pipeline stages, 1..layers+2 (default 2)
  --schedule NAME     sequential | gpipe | 1f1b (default) | eager-1f1b | pipedream | ddg | fr
  --plan P            given (default): the flags decide | auto: profile a
                      micro-batch and search stages (up to --stages), synchronous
                      schedule, micro-batches, recomputation and split for the
                      fastest predicted step
  --memory-budget N   with --plan auto: MiB each stage may hold (default: any)
  --microbatches N    see above (default 4)
  --batch N           sequences per mini-batch, i.e. per update (default 32)
  --epochs N          passes over the train sequences (default 1)
  --train-limit N     train on a fixed subset of N sequences (default 0: all)
  --eval-limit N      score a fixed subset of N valid sequences (default 0: all)
  --lr X              peak learning rate (default 0.002)
  --warmup F          share of the updates spent warming up (default 0.1)
  --clip X            clip gradients to this global norm, 0: none (default 0)
  --autocast none|bf16|fp16
                      every stage's forward under autocast (default none)
  --fused-ops on|off  conveyor's fused attention (default off)
  --threads N         intra-op threads per stage (default cores / stages)
  --seed N            initial weights, batch order and masks (default 1)
  --require-drop X    nats the valid loss must fall by (default 1)
)";

constexpr const char* kHelpEnd = R"(
Exit status: 0 when the valid loss fell enough, 1 when not or training failed,
2 for invalid flags or missing data.
Example: bert_pipeline --stages 3 --schedule pipedream --microbatches 4
)";

struct Config {
  ex::BertSetup setup = ex::default_setup(CONVEYOR_BINARY_DIR "/bert-tokenizer");
  ex::BertTraining training;
  double require_drop = 1.0;
};

bool parse_args(int argc, char** argv, Config& c) {
  constexpr int64_t kBig = 1'000'000'000;
  ex::BertTraining& t = c.training;
  t.lr = 2e-3;
  t.final_test = true;
  ex::Flags flags;
  ex::add_setup_flags(flags, c.setup);
  flags.integer("--stages", &t.stages, 1, 64).integer("--microbatches", &t.microbatches, 1, 4096);
  flags.integer("--batch", &t.batch, 1, kBig).integer("--epochs", &t.epochs, 1, kBig);
  flags.integer("--train-limit", &t.train_limit, 0, kBig).integer("--eval-limit", &t.eval_limit, 0, kBig);
  flags.real("--lr", &t.lr, 1e-12, 1e3).real("--warmup", &t.warmup, 0, 1);
  flags.real("--require-drop", &c.require_drop, 0, 1e3);
  flags.real("--clip", &t.clip, 0, 1e9).text("--autocast", &t.autocast).text("--plan", &t.plan);
  flags.integer("--memory-budget", &t.memory_budget, 1, kBig);
  flags.integer("--threads", &t.threads, 1, 1024).integer("--seed", &t.seed, 0, kBig).text("--schedule", &t.schedule);
  flags.on("--fused-ops", [&t](const std::string& flag, const std::string& value) {
    if (value != "on" && value != "off") throw ex::UsageError(flag + " expects on or off, got '" + value + "'");
    t.fused = value == "on";
  });
  if (!flags.parse(argc, argv)) return false;
  const auto& names = conveyor::schedules::schedule_names();
  if (std::find(names.begin(), names.end(), t.schedule) == names.end()) {
    throw ex::UsageError("--schedule expects sequential, gpipe, 1f1b, eager-1f1b, pipedream, ddg or fr, got '" +
                         t.schedule + "'");
  }
  if (t.plan != "given" && t.plan != "auto") throw ex::UsageError("--plan expects given or auto, got '" + t.plan + "'");
  if (t.memory_budget > 0 && t.plan != "auto") throw ex::UsageError("--memory-budget is for --plan auto");
  if (t.stages > c.setup.model.layers + 2) {
    throw ex::UsageError("--stages " + std::to_string(t.stages) + ": the model has only " +
                         std::to_string(c.setup.model.layers + 2) + " layers (embeddings, encoders, head)");
  }
  return true;
}

int run(Config& c) {
  const ex::MlmData data = ex::load_setup_data(c.setup, std::cout);
  ex::BertTraining& t = c.training;
  const bool async = !conveyor::schedules::make_schedule(t.schedule, 1, 1).synchronous();
  if (async && t.microbatches < t.stages) {
    throw ex::UsageError(t.schedule + " with " + std::to_string(t.stages) +
                         " stages needs --microbatches of at least " + std::to_string(t.stages) +
                         ": the pipeline must fill");
  }
  if (!async && t.microbatches > t.batch) {
    throw ex::UsageError("--microbatches (" + std::to_string(t.microbatches) + ") cannot exceed --batch (" +
                         std::to_string(t.batch) + ")");
  }
  const ex::BertConfig& m = c.setup.model;
  std::cout << "model: " << ex::describe_model(m) << "\ntraining: ";
  if (t.plan == "auto") {
    std::cout << "--plan auto (up to " << t.stages << " stages; the plan follows), mini-batches";
  } else {
    std::cout << t.schedule << ", " << t.stages << " stages, " << t.microbatches
              << (async ? " mini-batches per step" : " micro-batches per mini-batch");
  }
  std::cout << " of " << t.batch
            << " sequences, " << t.epochs << " epoch(s), AdamW lr " << t.lr << "\n"
            << std::flush;
  std::unique_ptr<ex::ProgressBar> progress;
  ex::BertHooks hooks;
  hooks.note = [](const std::string& line) { std::cout << "  " << line << "\n" << std::flush; };
  hooks.step = [&](int64_t done, int64_t total, double loss, double rate) {
    if (!progress) {
      progress = std::make_unique<ex::ProgressBar>(std::cerr, total, ex::ProgressBar::stderr_is_tty(),
                                                   std::clamp<int64_t>(total / 10, 1, 50));
    }
    progress->update(done, loss, rate);
  };
  hooks.epoch = [&](const ex::EpochReport& r) {
    const std::string line = "  epoch " + std::to_string(r.epoch) + ": train loss " + ex::fixed(r.train_loss, 3) +
                             ", valid masked-LM loss " + ex::fixed(r.eval_loss, 3) + ", accuracy " +
                             ex::fixed(r.eval_accuracy, 1) + "%, " + ex::fixed(r.seconds, 1) + " s";
    if (progress) progress->note(line);
    else std::cout << line << "\n";
  };
  const ex::BertOutcome out = ex::train_bert(data, m, t, hooks);
  if (progress) progress->finish();
  std::cout << "result (" << out.train_sequences << " train sequences, " << out.updates_per_epoch
            << " updates per epoch, " << out.eval_sequences << " valid sequences):\n  valid masked-LM loss "
            << ex::fixed(out.initial_eval_loss, 3) << " before training";
  if (out.diverged()) {
    std::cout << "\nFAIL: training diverged in epoch " << out.diverged_epoch << ": " << out.why
              << "; try a smaller --lr\n";
    return 1;
  }
  const ex::EpochReport& last = out.epochs.back();
  std::cout << " -> " << ex::fixed(last.eval_loss, 3) << " (accuracy " << ex::fixed(out.initial_eval_accuracy, 1)
            << "% -> " << ex::fixed(last.eval_accuracy, 1) << "%)\n  test masked-LM loss "
            << ex::fixed(out.test_loss, 3)
            << ", accuracy " << ex::fixed(out.test_accuracy, 1) << "%; unigram baseline "
            << ex::fixed(data.valid_unigram.cross_entropy, 3) << " nats\n";
  const double drop = out.initial_eval_loss - last.eval_loss;
  const bool pass = drop >= c.require_drop;
  std::cout << (pass ? "PASS" : "FAIL") << ": the valid masked-LM loss fell by " << ex::fixed(drop, 3)
            << " nats (required: " << c.require_drop << ")" << (pass ? "" : "; train longer (--epochs)") << "\n";
  return pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Config config;
  return ex::run_main(
      "bert_pipeline", std::string(kHelp) + "\n" + ex::kSetupFlagsHelp + kHelpEnd,
      [&] { return parse_args(argc, argv, config); }, [&] { return run(config); });
}
