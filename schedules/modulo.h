#pragma once
// modulo_schedule(): a schedule that repeats one micro-batch's pattern at a
// fixed interval, as a compiler's modulo scheduling pipelines a loop.
//
// The pattern places each stage's F, I and W of one micro-batch at a start
// time: each as early as its input allows (the previous stage's F, the next
// stage's I, its own I, plus a transfer between workers) and where it
// overlaps nothing its worker already runs, counted modulo the interval.
// Micro-batch j runs the pattern shifted by j intervals, and each worker's
// line is its actions in order of those times. With an interval equal to the
// busiest worker's F + I + W for one micro-batch, the steady state has no
// bubble, and what a worker holds is set by how long each activation lives
// (F to W) against the interval: the chain of one micro-batch, not a warm-up
// of many, decides the memory. This is how the zero-bubble authors' V-Half
// and V-Min are built (a repeated building block, squeezed at the ends); the
// simulator does the squeezing here, running each line's actions as early as
// their inputs allow. A longer interval holds less at the price of a steady
// bubble: memory as a dial.

#include "schedules/schedule.h"
#include "schedules/synthesise.h"

#include <optional>
#include <vector>

namespace conveyor::schedules {

// The busiest worker's F + I + W for one micro-batch: the shortest interval
// at which every worker's pattern fits.
double modulo_interval(const SynthesisProblem& problem, const std::vector<int>& placement);

// nullopt when the pattern does not fit the interval (a worker's free time
// modulo it is split into gaps too short for an action). `weights_last`
// places every W after the whole chain of F's and I's (the chain first, so it
// is never delayed by a W); otherwise each W right after its I.
std::optional<Schedule> modulo_schedule(const SynthesisProblem& problem, const std::vector<int>& placement,
                                        double interval, bool weights_last);

}  // namespace conveyor::schedules
