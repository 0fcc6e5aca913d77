#pragma once
// Training the BERT example under any schedule, shared by bert_pipeline (the
// demo) and bert_study (the seed study): the pipeline, the optimiser and its
// learning-rate schedule, the epochs, divergence, and held-out scoring.

#include "examples/bert/bert_data.h"
#include "examples/bert/bert_model.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace conveyor::examples {

struct BertTraining {
  std::string schedule = "1f1b";
  int64_t stages = 2;
  // Synchronous schedules: micro-batches a mini-batch is split into.
  // Asynchronous ones: mini-batches (updates) per pipeline step.
  int64_t microbatches = 4;
  int64_t batch = 32;  // sequences per mini-batch, i.e. per update
  // Updates per epoch are a multiple of this (0: microbatches), so that
  // methods with different step sizes make the same updates.
  int64_t round = 0;
  int64_t epochs = 1;
  int64_t train_limit = 0, eval_limit = 0;  // sequences used of train and valid (0: all)
  double lr = 1e-3, warmup = 0.1, weight_decay = 0.01;  // AdamW; warm-up: a share of the updates, then linear to 0
  double clip = 0;                     // gradient-norm limit (PipelineOptions::clip_grad_norm), 0: none
  std::string autocast = "none";       // none | bf16 | fp16 (PipelineOptions::autocast)
  double diverge_loss = 0;                               // epoch train loss counted as divergence (0: ln V)
  Masking masking;
  bool fused = false;
  bool final_test = false;  // score the test split after the last epoch
  int64_t seed = 1, threads = 0;
  // "auto": search stages (up to `stages`), synchronous schedule, micro-batches,
  // recomputation and split on the profile of a micro-batch, within
  // `memory_budget` MiB per stage (0: any); "given": the fields above decide.
  std::string plan = "given";
  int64_t memory_budget = 0;
};

struct EpochReport {
  int64_t epoch = 0;
  double train_loss = 0, eval_loss = 0, eval_accuracy = 0;  // accuracy in percent
  double seconds = 0;                                       // training only
};

struct BertOutcome {
  double initial_eval_loss = 0, initial_eval_accuracy = 0;
  std::vector<EpochReport> epochs;  // completed ones
  int64_t updates_per_epoch = 0, train_sequences = 0, eval_sequences = 0;
  int64_t diverged_epoch = 0;  // 0: did not diverge
  std::string why;
  double test_loss = 0, test_accuracy = 0;
  bool diverged() const { return diverged_epoch > 0; }
};

struct BertHooks {
  std::function<void(const std::string&)> note;  // plan and set-up lines
  // After every pipeline step: updates done, of total, the step's loss and pieces per second.
  std::function<void(int64_t done, int64_t total, double loss, double pieces_per_second)> step;
  std::function<void(const EpochReport&)> epoch;
};

// Throws std::invalid_argument for settings that cannot run (more stages
// than layers, too few sequences for one update, an unknown schedule).
BertOutcome train_bert(const MlmData& data, const BertConfig& config, const BertTraining& training,
                       const BertHooks& hooks = {});

}  // namespace conveyor::examples
