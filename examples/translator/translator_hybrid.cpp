// The translator under torchrun: D data-parallel replicas of a K-stage
// pipeline, one process per stage, with seed 002's five rules: uniform
// initialisation (weights broadcast from replica 0), averaged gradients,
// sharded data (each replica its slice of every global batch), a scaled
// learning rate, and one rank (0) that logs, evaluates and checkpoints.

#include "examples/common/flags.h"
#include "examples/common/progress.h"
#include "examples/translator/translator_app.h"
#include "plugin/support/atomic_file.h"
#include "plugin/support/timing.h"
#include "plugin/distributed/distributed_runner.h"
#include "plugin/pipeline.h"

#include <torch/serialize.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <deque>
#include <iostream>

namespace conveyor::examples {

namespace {

// Replica d's share of a global batch: its contiguous slice, all slices of
// one size (the remainder of the batch is dropped, so averaging the replicas'
// gradients weighs every pair alike).
std::vector<int64_t> replica_share(const std::vector<int64_t>& batch, int replica, int replicas) {
  const size_t each = batch.size() / static_cast<size_t>(replicas);
  const auto begin = batch.begin() + static_cast<std::ptrdiff_t>(each * static_cast<size_t>(replica));
  return {begin, begin + static_cast<std::ptrdiff_t>(each)};
}

}  // namespace

int run_translator_hybrid(const TranslatorConfig& c, const LaunchEnvironment& env) {
  const int replicas = static_cast<int>(c.replicas), stages = static_cast<int>(c.stages);
  const auto timeout = std::chrono::minutes(2);
  ProcessGroups::Options group_options;
  group_options.timeout = timeout;
  auto groups = std::make_shared<ProcessGroups>(connect_store(env, std::chrono::minutes(5)), env.rank,
                                                HybridLayout::for_world(env.world_size, stages), group_options);
  const bool logging = groups->rank() == 0;
  const LoadedCorpus corpus = load_corpus(c, logging);  // every rank reads the same pairs, in the same order
  torch::manual_seed(static_cast<uint64_t>(c.seed));
  Translator model = make_translator(translator_shape(c, corpus.data));
  Pipeline pipe(model.layers,
                pipeline_options(c, model, /*own_optimizer=*/true)
                    .timeout(timeout)
                    .trace(false)
                    .scale_learning_rate(c.scale_lr)
                    .local_rank(env.local_rank),
                groups);
  TrainBatches batches(corpus, c.batch, c.microbatches * replicas, static_cast<uint64_t>(c.seed));
  if (logging) {
    std::cout << "hybrid: " << replicas << " replica(s) x " << stages << " stage(s), one process each; schedule "
              << c.schedule << ", " << c.microbatches << " micro-batches per replica batch, global batch up to "
              << c.batch << " pairs, Adam lr " << pipe.learning_rate(c.lr)
              << (c.scale_lr && replicas > 1 ? " (scaled by the replicas)" : "") << ", " << c.threads
              << " intra-op thread(s) per process\n"
              << std::flush;
  }
  ProgressBar progress(std::cerr, c.steps, ProgressBar::stderr_is_tty(), tail_steps(c.steps));
  double start_loss = 0, timed_pairs = 0;
  std::deque<double> recent;
  Clock::time_point first_step_done;
  for (int64_t step = 1; step <= c.steps; ++step) {
    const std::vector<int64_t>& global = batches.next();
    const auto share = replica_share(global, groups->replica(), replicas);
    std::vector<Tensors> inputs, targets;
    for (auto& m : make_microbatches(corpus.data.encoded[0], share, c.microbatches)) {
      inputs.push_back(std::move(m.inputs));
      targets.push_back(std::move(m.targets));
    }
    const StepResult r = pipe.train_microbatches(inputs, targets, translation_loss);
    if (step == 1) {
      first_step_done = Clock::now();
      start_loss = r.loss;
    } else {
      timed_pairs += static_cast<double>(share.size()) * replicas;
    }
    if (!std::isfinite(r.loss)) throw std::runtime_error("the loss became non-finite at step " + std::to_string(step));
    recent.push_back(r.loss);
    if (static_cast<int64_t>(recent.size()) > tail_steps(c.steps)) recent.pop_front();
    const double seconds = std::chrono::duration<double>(Clock::now() - first_step_done).count();
    if (logging) progress.update(step, r.loss, seconds > 0 ? timed_pairs / seconds : 0.0);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - first_step_done).count();
  progress.finish();
  pipe.distributed()->gather_model();
  int status = 0;
  if (logging) {
    double end_loss = 0;
    for (const double l : recent) end_loss += l / static_cast<double>(recent.size());
    const torch::nn::Sequential whole = pipe.distributed()->model();
    std::cout << "result:\n  train loss " << fixed(start_loss, 3) << " at the first step -> " << fixed(end_loss, 3)
              << "; valid loss " << fixed(mean_loss(whole, corpus.data.encoded[1], corpus.bounds, c.batch), 3) << "\n";
    std::pair<double, double> bleu;
    if (c.bleu) bleu = evaluate_bleu(c, corpus, whole);
    if (!c.checkpoint.empty()) {
      write_atomically(c.checkpoint, [&](std::ostream& out) { torch::save(whole, out); });
      std::cout << "saved " << c.checkpoint << "\n";
    }
    status = verdict(c, start_loss, end_loss, c.bleu ? &bleu : nullptr);
    std::cout << "samples/s: " << fixed(seconds > 0 ? timed_pairs / seconds : 0.0, 1) << std::endl;
  }
  groups->barrier();
  return status;
}

}  // namespace conveyor::examples
