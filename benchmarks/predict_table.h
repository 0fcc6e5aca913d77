#pragma once
// bench_pipeline --predict: the planner's predicted step time and per-stage
// stash against measured ones, from one profile, for K = 2..4 and the
// schedules the planner prices (gpipe, 1f1b, eager-1f1b, interleaved, zb-h1,
// and PipeDream with its optimizer step after every backward).

#include <cstdint>
#include <string>

namespace conveyor::bench {

// `model`: lstm, mlp, resnet, transformer (bench_models.h), bert (the BERT
// example's masked-LM model, sequences of 32 tokens) or translator (the
// translator's encoder-decoder with attention, sentences of 10-25 words).
// One profile at a quarter of the batch (ProfileOptions::count_cores: the
// workers share this CPU as measured), every configuration built with
// Balance::kTime and measured `steps` times after a warm-up, the
// configurations taking turns step by step; `sharing`:
// ProfileOptions::sharing_stages. Prints a markdown table; returns 0, or 2
// for an unknown model.
int predict_table(const std::string& model, int64_t batch, int steps, int threads, int sharing);

// Whether predict_table knows `model`.
bool predict_table_knows(const std::string& model);

}  // namespace conveyor::bench
