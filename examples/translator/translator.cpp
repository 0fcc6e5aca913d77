// translator: an LSTM encoder-decoder with attention that learns English to
// Spanish from the King James Version and the Reina-Valera 1909, verse by
// verse, trained as a pipeline of stages (or, under torchrun, as data-parallel
// replicas of a pipeline), scored by BLEU against a copy-the-source baseline.
// Run with --help.

#include "examples/common/flags.h"
#include "examples/translator/translator_app.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <thread>

namespace ex = conveyor::examples;

namespace {

constexpr const char* kHelp = R"(translator: English -> Spanish with an LSTM encoder-decoder, trained as a pipeline.

  build/examples/translator --stages 2 --schedule 1f1b --steps 600

Data: Debian's King James Version (package sword-text-kjv, SWORD module
engKJV2006eb) and Reina-Valera 1909 (sword-text-sparv, spaRV1909eb), read with
diatheke (package diatheke; scripts/setup.sh installs all three; nothing is
downloaded) and aligned by verse reference (31,084 verses). The first run
caches each module's verses in --cache-dir. Markup (Strong's numbers, OSIS
escapes, paragraph signs, the KJV's [supplied words] brackets) is stripped.
Text is lower-cased and split into words and punctuation; pairs with a side
over --max-tokens tokens are left out. The split is fixed: a hash of the verse
reference (seed 14) puts each pair in train, valid or test (about 90/5/5;
with the defaults 11,933 / 680 / 698 pairs), whatever the order or the other
verses. Each side's vocabulary is its --vocab most frequent train words.
With --source-file and --target-file: line i of one translates line i of the
other ("line i" is the reference that is hashed).

Model: source embedding -> 2 LSTMs (encoder) | target embedding -> 2 LSTMs
(decoder, teacher forcing) -> attention over the encoder's outputs, padding
masked out -> projection to the target vocabulary (optionally tied to the
target embedding). One torch::nn::Sequential of layers of several tensors: the
encoder's outputs and the source mask ride along to the decoder's stages, so
the pipeline cuts it between any layers (--stages 1..10, balanced by cost).

Bucketing: pairs are grouped by length (the longer side) into buckets every
--bucket-width tokens; each batch is drawn from one bucket, cut into
--microbatches micro-batches, and each micro-batch is padded to its own
longest sentence (Pipeline::train_microbatches). Padding is neither attended
to nor in the loss (mean cross-entropy per target token).

Evaluation: valid loss every --eval-every steps; at the end greedy decoding of
the test split with the unsplit model, detokenised, scored by sacrebleu (in
the project's .venv; lower-cased BLEU, 13a tokenisation) next to the
copy-the-source baseline (the English verse taken as its Spanish translation),
with --samples sample translations.

Hybrid (seed 002's five rules), under torchrun:
  torchrun --nproc-per-node=4 --no-python build/examples/translator --replicas 2
runs WORLD_SIZE / --replicas stages per replica, one process each: weights
broadcast from replica 0, gradients averaged across replicas, each replica its
shard of every global --batch, the learning rate times --replicas (--scale-lr),
and only rank 0 logs, evaluates and writes --checkpoint. Rank 0's last line
is "samples/s: X" (pairs per second after the first step).

Flags (--flag VALUE or --flag=VALUE):
  --stages N          pipeline stages, 1..10 (default 2; under torchrun WORLD_SIZE / --replicas)
  --microbatches N    micro-batches per batch (default 4)
  --schedule NAME     sequential | gpipe | 1f1b (default) | eager-1f1b | pipedream | ddg | fr;
                      asynchronous ones step an Adam per stage after every micro-batch
  --plan P            given (default): the flags decide | auto: profile the first
                      micro-batch and search stages (up to --stages), synchronous
                      schedule, micro-batches, recomputation and split for the
                      fastest predicted step (in one process)
  --memory-budget N   with --plan auto: MiB each stage may hold (default: any)
  --steps N           training batches (default 600)
  --batch N           pairs per batch, the global batch under torchrun (default 64)
  --max-tokens N      longest side kept, in tokens (default 25)
  --bucket-width N    tokens between bucket bounds (default 5)
  --vocab N           words per vocabulary, <unk> included (default 6000)
  --embed N           embedding width (default 128)
  --hidden N          LSTM width (default 256)
  --dropout P         dropout in [0, 1) (default 0.1)
  --tie on|off        projection tied to the target embedding (default off;
                      synchronous schedules only)
  --lr X              Adam learning rate (default 0.002)
  --clip X            gradient-norm limit, 0: none (default 1): the global norm
                      over every stage for synchronous schedules, each stage's
                      own for asynchronous ones (PipelineOptions::clip_grad_norm)
  --autocast none|bf16|fp16
                      every stage's forward under autocast (default none)
  --threads N         intra-op threads per stage (default cores / stages)
  --eval-every N      steps between valid losses, 0: at the end (default 200)
  --train-pairs N     use the first N train pairs only, 0: all (default 0)
  --test-pairs N      translate the first N test pairs only, 0: all (default 0)
  --samples N         sample translations printed (default 5)
  --bleu on|off       greedy decoding and BLEU at the end (default on)
  --require-drop F    exit 1 unless the final train loss is at most (1 - F)
                      times the first step's (default 0.2)
  --require-bleu on|off  exit 1 unless the model's BLEU beats the copy
                      baseline's, when --bleu is on (default on)
  --source-file PATH, --target-file PATH   parallel text files instead of the modules
  --cache-dir DIR     where the modules' verses are cached (default: the build's translator-corpus)
  --out-dir DIR       where hypotheses, references and sources are written
                      (default: the build's translator-output)
  --python PATH       the Python with sacrebleu (default: the project's .venv)
  --replicas N        data-parallel replicas under torchrun (default 1)
  --scale-lr on|off   learning rate times --replicas under torchrun (default on)
  --checkpoint PATH   under torchrun, rank 0 saves the trained model there
  --seed N            seed of the weights, dropout and batch order (default 1)
  --help              this text

Exit status: 0 when the training loss fell by --require-drop and (with --bleu
and --require-bleu on) the model's BLEU beats the copy baseline's; 1 when not, or training
failed; 2 for invalid flags or missing data (no diatheke, no module, a missing
file, parallel files of different lengths).
)";

bool on_off(const std::string& flag, const std::string& value) {
  if (value == "on") return true;
  if (value == "off") return false;
  throw ex::UsageError(flag + " expects on or off, got '" + value + "'");
}

// Returns false when --help was asked for.
bool parse_args(int argc, char** argv, ex::TranslatorConfig& c) {
  constexpr int64_t kBig = 1'000'000'000;
  ex::Flags f;
  f.integer("--stages", &c.stages, 1, 10).integer("--microbatches", &c.microbatches, 1, kBig);
  f.integer("--steps", &c.steps, 1, kBig).integer("--batch", &c.batch, 1, kBig);
  f.integer("--max-tokens", &c.max_tokens, 1, 1000).integer("--bucket-width", &c.bucket_width, 1, 1000);
  f.integer("--vocab", &c.vocab, 2, kBig).integer("--embed", &c.embed, 1, kBig).integer("--hidden", &c.hidden, 1, kBig);
  f.integer("--threads", &c.threads, 1, 1024).integer("--eval-every", &c.eval_every, 0, kBig);
  f.integer("--train-pairs", &c.train_pairs, 0, kBig).integer("--test-pairs", &c.test_pairs, 0, kBig);
  f.integer("--samples", &c.samples, 0, kBig).integer("--replicas", &c.replicas, 1, 1024);
  f.integer("--seed", &c.seed, 0, INT64_MAX).integer("--memory-budget", &c.memory_budget, 1, kBig);
  f.real("--dropout", &c.dropout, 0.0, 1.0, false).real("--lr", &c.lr, 1e-12, 1e3, false);
  f.real("--clip", &c.clip, 0.0, 1e9, false).real("--require-drop", &c.require_drop, 0.0, 1.0, false);
  f.on("--tie", [&](const std::string& flag, const std::string& v) { c.tie = on_off(flag, v); });
  f.on("--bleu", [&](const std::string& flag, const std::string& v) { c.bleu = on_off(flag, v); });
  f.on("--require-bleu", [&](const std::string& flag, const std::string& v) { c.require_bleu = on_off(flag, v); });
  f.on("--scale-lr", [&](const std::string& flag, const std::string& v) { c.scale_lr = on_off(flag, v); });
  f.text("--schedule", &c.schedule).text("--source-file", &c.source_file).text("--target-file", &c.target_file);
  f.text("--cache-dir", &c.cache_dir).text("--out-dir", &c.out_dir).text("--python", &c.python);
  f.text("--checkpoint", &c.checkpoint).text("--autocast", &c.autocast).text("--plan", &c.plan);
  if (!f.parse(argc, argv)) return false;
  const auto& names = conveyor::schedules::schedule_names();
  if (std::find(names.begin(), names.end(), c.schedule) == names.end()) {
    std::string all;
    for (const auto& n : names) all += (all.empty() ? "" : " | ") + n;
    throw ex::UsageError("--schedule expects one of " + all + ", got '" + c.schedule + "'");
  }
  if (c.plan != "given" && c.plan != "auto") throw ex::UsageError("--plan expects given or auto, got '" + c.plan + "'");
  if (c.memory_budget > 0 && c.plan != "auto") throw ex::UsageError("--memory-budget is for --plan auto");
  if (c.microbatches > c.batch) {
    throw ex::UsageError("--microbatches (" + std::to_string(c.microbatches) + ") cannot exceed --batch (" +
                         std::to_string(c.batch) + "): every micro-batch needs a pair");
  }
  if (c.cache_dir.empty()) c.cache_dir = CONVEYOR_TRANSLATOR_BUILD_DIR "/translator-corpus";
  if (c.out_dir.empty()) c.out_dir = CONVEYOR_TRANSLATOR_BUILD_DIR "/translator-output";
  if (c.python.empty()) c.python = CONVEYOR_TRANSLATOR_PYTHON;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  ex::TranslatorConfig config;
  try {
    if (!parse_args(argc, argv, config)) {
      std::cout << kHelp;
      return 0;
    }
    // torchrun sets WORLD_SIZE: then this process is one stage of one replica.
    const bool launched = std::getenv("WORLD_SIZE") != nullptr;
    const auto env = conveyor::LaunchEnvironment::from_environment();
    if (launched) {
      if (env.world_size % config.replicas != 0) {
        throw ex::UsageError("WORLD_SIZE=" + std::to_string(env.world_size) + " is not a multiple of --replicas " +
                             std::to_string(config.replicas));
      }
      config.stages = env.world_size / config.replicas;
      if (config.plan == "auto") {
        throw ex::UsageError(
            "--plan auto plans a pipeline in one process; under torchrun the processes are the stages");
      }
    }
    const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
    const int64_t per_machine = launched ? std::max(1, env.world_size) : config.stages;
    if (config.threads == 0) config.threads = std::max<int64_t>(1, cores / per_machine);
    at::set_num_threads(static_cast<int>(config.threads));
    return launched ? ex::run_translator_hybrid(config, env) : ex::run_translator(config);
  } catch (const ex::UsageError& e) {
    std::cerr << "translator: " << e.what() << "\nRun 'translator --help' for the flags and the data.\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "translator: " << e.what() << "\n";
    // A refused configuration or unreadable data is the caller's to fix (2); anything else failed (1).
    const bool bad_input = dynamic_cast<const std::invalid_argument*>(&e) || dynamic_cast<const ex::DataError*>(&e);
    return bad_input ? 2 : 1;
  }
}
