#pragma once
// The translator program's parts (examples/translator/translator.cpp has its flags and
// help): loading the corpus, the pipeline's options, training in one process
// or as a torchrun hybrid of replicas and stages, and evaluating.

#include "examples/translator/translation_data.h"
#include "examples/translator/translator_model.h"
#include "plugin/conveyor.h"
#include "plugin/distributed/process_groups.h"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace conveyor::examples {

struct TranslatorConfig {
  int64_t stages = 2, microbatches = 4, steps = 600, threads = 0, replicas = 1;
  std::string autocast = "none";  // --autocast none|bf16|fp16
  std::string schedule = "1f1b", source_file, target_file, cache_dir, out_dir, python, checkpoint;
  std::string plan = "given";  // --plan given|auto
  int64_t memory_budget = 0;   // --memory-budget MiB per stage's worker (with --plan auto), 0: any
  std::string source_module = "engKJV2006eb", target_module = "spaRV1909eb";
  int64_t batch = 64, max_tokens = 25, bucket_width = 5, embed = 128, hidden = 256, vocab = 6000;
  int64_t train_pairs = 0, test_pairs = 0, samples = 5, eval_every = 200, seed = 1;
  double dropout = 0.1, lr = 2e-3, clip = 1.0, require_drop = 0.2;
  bool tie = false, bleu = true, require_bleu = true, scale_lr = true;
};

// The corpus could not be read: no diatheke, no module, a missing file,
// parallel files of different lengths, nothing left after filtering.
struct DataError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct LoadedCorpus {
  TranslationData data;
  std::vector<int64_t> bounds;  // bucket bounds
};

// The train split's batches, one bucket each, reshuffled every epoch (by
// --seed and the epoch), endlessly. Batches under `min_batch` pairs (a
// bucket's remainder) are left out.
class TrainBatches {
 public:
  TrainBatches(const LoadedCorpus& corpus, int64_t batch, int64_t min_batch, uint64_t seed);
  const std::vector<int64_t>& next();
  int64_t per_epoch() const { return static_cast<int64_t>(batches_.size()); }

 private:
  const LoadedCorpus& corpus_;
  int64_t batch_, min_batch_;
  uint64_t seed_;
  int64_t epoch_ = 0;
  size_t position_ = 0;
  std::vector<std::vector<int64_t>> batches_;
};

// Reads the verses (or the parallel files), splits, filters and encodes
// them, and prints what was read when `verbose`. Throws DataError naming the
// cause.
LoadedCorpus load_corpus(const TranslatorConfig& c, bool verbose);

TranslatorShape translator_shape(const TranslatorConfig& c, const TranslationData& data);

// The pipeline's options for `c` (stages balanced by the layers' costs; the
// projection tied to the target embedding with --tie; an Adam per stage for
// asynchronous schedules and in the hybrid). Throws std::invalid_argument
// for a tie under an asynchronous schedule, saying why.
PipelineOptions pipeline_options(const TranslatorConfig& c, const Translator& model, bool own_optimizer);

// Steps whose loss is averaged for the "end" of training.
int64_t tail_steps(int64_t steps);

// Mean loss per target token over `pairs` with teacher forcing, the whole
// model in evaluation mode (dropout off).
double mean_loss(torch::nn::Sequential layers, const std::vector<EncodedPair>& pairs,
                 const std::vector<int64_t>& bounds, int64_t batch);

// Greedy translations of the test split (its first --test-pairs), written
// with the references and the sources to --out files and scored by
// sacrebleu; the source taken as its own translation is the copy baseline.
// Prints --samples translations. Returns {model BLEU, copy BLEU}.
std::pair<double, double> evaluate_bleu(const TranslatorConfig& c, const LoadedCorpus& corpus,
                                        torch::nn::Sequential layers);

// The training loss fell by --require-drop, and (when BLEU was computed and
// --require-bleu is on) the model beats the copy baseline: prints PASS or
// FAIL and why; returns the exit status.
int verdict(const TranslatorConfig& c, double start_loss, double end_loss, const std::pair<double, double>* bleu);

// One process: the pipeline's stages are threads of this process.
int run_translator(const TranslatorConfig& c);
// Under torchrun: --replicas data-parallel replicas of a WORLD_SIZE /
// --replicas stage pipeline, one process per stage.
int run_translator_hybrid(const TranslatorConfig& c, const LaunchEnvironment& env);

}  // namespace conveyor::examples
