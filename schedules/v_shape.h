#pragma once
// The V-shaped schedules: K workers run 2K stages, worker k stages k and
// 2K-1-k, so a micro-batch goes down the workers on its first chunks and back
// up on its second, and the first and last stage (embedding and loss) share
// worker 0. The turn from stage K-1 to stage K stays on worker K-1: a
// hand-over within one thread or process, no transfer.
//
// ZB-V, V-Half and V-Min (Qi et al., "Pipeline Parallelism with Controllable
// Memory", 2024) are one shape at three memory caps, each stage's F, I and W
// taken as equal: built by synthesise() (schedules/synthesise.h) with a cap per
// worker, in chunk activations (one micro-batch's activations on one chunk,
// half of a 1F1B stage's):
//   zb-v    2K: 1F1B's peak (K whole stages), close to zero bubble;
//   v-half  K + 1: about half of 1F1B's, a smaller bubble than 1F1B's;
//   v-min   ceil(2K/3) + 1 (at least 2): about a third; below 1F1B's step at
//           K = 2, 4 and 7, where a repeated pattern fits the cap, and up to
//           1.28 of it at K = 3, 5, 6 and 8, where only the greedy passes do.
// Each is the synthesiser's best at its cap, so it holds at most the cap.
// Synchronous, exact gradients; splits backwards into I and W.

#include "schedules/schedule.h"

#include <string>
#include <vector>

namespace conveyor::schedules {

// Their names, lower case: "zb-v", "v-half", "v-min", "dualpipev".
const std::vector<std::string>& v_shape_names();
// By one of those names; throws std::invalid_argument for another.
Schedule make_v_shape(const std::string& name, int num_workers, int num_microbatches);

Schedule make_zb_v(int num_workers, int num_microbatches);
Schedule make_v_half(int num_workers, int num_microbatches);
Schedule make_v_min(int num_workers, int num_microbatches);

// The chunk activations each worker may hold under the named V schedule.
double v_memory_cap(const std::string& name, int num_workers);

// DualPipeV (DeepSeek's DualPipe cut in half, torch.distributed.pipelining's
// ScheduleDualPipeV) on the same V: after a warm-up of forwards, each worker
// alternates the forward of one micro-batch on one chunk with the backward of
// another on the other chunk, and splits some backwards into I and W where
// that fills the warm-up and cool-down. DualPipe overlaps each such pair on
// the GPU to hide expert-parallel all-to-all communication behind
// computation; without that communication the overlap buys nothing, so here
// each pair is two actions the worker runs in turn on its one stream. Needs M
// >= 2K.
Schedule make_dualpipev(int num_workers, int num_microbatches);

}  // namespace conveyor::schedules
