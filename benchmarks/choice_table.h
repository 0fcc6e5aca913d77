#pragma once
// bench_pipeline --choose: how well the planner chooses. On a grid of models
// x memory budgets x device counts, every plan of the search space that fits
// is built and measured, and the plan the planner chose is compared with the
// fastest measured one.

#include <cstdint>
#include <string>

namespace conveyor::bench {

// For each of the models "mlp" (batch 256), "lstm" (32 sequences), "resnet"
// (32 images) and "transformer" (32 sequences), from one profile (at a
// quarter of the batch) and with the space below: budgets none, halfway
// between the one-worker plan's peak and the leanest plan's, and just above
// the leanest plan's; up to 2 and up to 4 workers (threads of this CPU).
// Every distinct plan any cell's search finds fitting is screened (median of
// `steps` steps, all of a model's plans taking turns step by step); the plans
// that decide a cell (its choices and its three fastest screened) are then
// measured again with the other pipelines released (median of 9 x `steps`
// steps, taking turns). Per cell, the planner's choice (the profile as
// measured, with the CPU's cores counted: ProfileOptions::count_cores, and
// tuned: race_candidates) against the best of those plans that fits. `only`: that model alone (empty: all four); `sharing`:
// ProfileOptions::sharing_stages of the profile. Prints markdown tables;
// returns 0.
int choice_table(int steps, const std::string& only, int sharing);

}  // namespace conveyor::bench
