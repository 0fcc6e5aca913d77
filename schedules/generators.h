#pragma once
// Schedule generators: pure functions of (stages K, micro-batches M). Each
// returns stage k's actions in the order that stage runs them; the runtime
// only walks the lists, and transfers between stages order them in time.

#include "schedules/schedule.h"

#include <string>
#include <vector>

namespace conveyor::schedules {

// Naive model parallelism: one micro-batch at a time goes forward through
// every stage and back before the next starts. Stage k: F0 B0 F1 B1 ...
Schedule make_sequential(int num_stages, int num_microbatches);

// GPipe (fill-drain): every forward, then every backward. Holds M
// micro-batches per stage at the peak.
Schedule make_gpipe(int num_stages, int num_microbatches);

// 1F1B (PipeDream-Flush): stage k runs min(M, K-k-1) warm-up forwards, then
// alternates one forward and one backward, then drains. Same bubble as GPipe,
// at most min(M, K-k) micro-batches in flight on stage k.
Schedule make_1f1b(int num_stages, int num_microbatches);

// Eager 1F1B: 1F1B with `lookahead` more warm-up forwards per later stage,
// min(M, (1 + lookahead) * (K-1-k)) on stage k, so that a forward's message
// and its gradient's reply travel while the stage computes the forwards ahead
// of them. 1F1B's order with a slow link makes each micro-batch wait for a
// round trip (2 latencies per boundary); eager 1F1B keeps the steady state
// compute-bound while 2 * latency <= lookahead * (F + B). Its price: stage k
// holds min(M, (1 + lookahead) * (K-1-k) + 1) micro-batches at the peak
// (1F1B: K-k). Synchronous, exact gradients. Throws for lookahead < 1.
Schedule make_eager_1f1b(int num_stages, int num_microbatches, int lookahead = 1);

// --- Asynchronous methods: every micro-batch is a mini-batch with its own
// optimizer step on each stage, right after that stage's backward of it.
// Stage k's backward of micro-batch t runs d_k = K-1-k micro-batches after its
// forward, so stage k holds K-k micro-batches at the peak. The pipeline fills
// and drains within one schedule. M < K is rejected: the pipeline would never
// fill.

// PipeDream (1F1B without flushes, weight stashing): 1F1B's order, the
// backward differentiates the weights its forward used. With vertical sync
// every stage's forward of t uses the version stage 0's forward used.
Schedule make_pipedream(int num_stages, int num_microbatches, bool vertical_sync = false);

// DDG, decoupled parallel backpropagation with delayed gradients: lock-step
// iterations; in iteration t stage k runs the forward of t with its current
// weights, then the backward of t-d_k with the (stashed) weights and states of
// that forward and the error gradient stage k+1 sent one iteration earlier.
Schedule make_ddg(int num_stages, int num_microbatches);

// Features replay: DDG's iterations, but stage k keeps only its input of t and
// its backward first replays the forward with the current weights (no
// staleness; forward and backward see different weights).
Schedule make_fr(int num_stages, int num_microbatches);

// --- Beyond the seeds: synchronous schedules with exact gradients.

// Interleaved 1F1B (Megatron-LM's virtual pipeline): K workers each run v
// model chunks, the model cut into K*v stages placed in a loop (stage s on
// worker s % K). Micro-batches go through the chunks in rounds of K; each
// worker warms up with (v-1)*K + 2*(K-1-w) forwards, then alternates one
// forward and one backward. For equal costs the bubble is (K-1)/v of one
// micro-batch's time through the model: v times smaller than 1F1B's, for
// v times more transfers. Needs v >= 2 and M a multiple of K.
Schedule make_interleaved_1f1b(int num_workers, int chunks, int num_microbatches);

// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2024): 1F1B with each
// backward split into I (input gradients, on the critical path) and W (weight
// gradients). Stage k delays its W's by k backwards, which fill the cooldown's
// bubble: for F = I = W the bubble is (K-1)(F + I - W), a third of 1F1B's.
// Each stage holds up to K micro-batches until their W (1F1B: K-k).
Schedule make_zb_h1(int num_stages, int num_microbatches);

// Interleaved 1F1B with split backwards (torch.distributed.pipelining's
// ScheduleInterleavedZeroBubble): the interleaved order with (v-1)*K + (K-1-w)
// warm-up forwards, each worker's W's delayed by w backwards. Needs M a
// multiple of K; with K >= 5 its channels must hold up to 4 messages
// (PipelineOptions::channel_capacity).
Schedule make_interleaved_zb(int num_workers, int chunks, int num_microbatches);

// Inference: forwards only. With a placement (stage -> worker, see
// Schedule::placement), each worker takes the micro-batches in turn through
// the stages it runs.
Schedule make_forward_only(int num_stages, int num_microbatches, const std::vector<int>& placement = {});

// By name, case-insensitive: see schedule_names(). `num_workers` workers
// each run `chunks` stages (chunks > 1: the interleaved schedules, any number,
// and the V schedules, exactly 2; 0: default_chunks()).
// Throws std::invalid_argument for an unknown name, K < 1, M < 1, chunks that
// the schedule does not take, and vertical sync asked of a method without it
// (only "pipedream" has it). `lookahead`: eager-1f1b's (0: its default, 1);
// other schedules take only 0.
Schedule make_schedule(const std::string& name, int num_workers, int num_microbatches, bool vertical_sync = false,
                       int chunks = 0, int lookahead = 0);

// Whether the named schedule loops several chunks per worker (stage s on
// worker s % K: interleaved, zb-interleaved), any number of them.
bool is_interleaved(const std::string& name);

// Whether the named schedule places 2 chunks per worker in a V (zb-v, v-half,
// v-min, dualpipev: schedules/v_shape.h).
bool is_v_shape(const std::string& name);

// The chunks per worker a name runs unless told otherwise: 2 for the
// interleaved and V schedules, 1 for the others.
int default_chunks(const std::string& name);

// The names make_schedule() knows: the one list of them.
const std::vector<std::string>& schedule_names();
// Those of them whose schedules are synchronous (the whole batch's exact
// gradients, one update a step), or asynchronous (an update a micro-batch).
const std::vector<std::string>& schedule_names(bool synchronous);

}  // namespace conveyor::schedules
