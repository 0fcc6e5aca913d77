// The translator in one process: the pipeline's stages are threads, trained
// on micro-batches of their own shapes (bucketing) under any schedule.

#include "examples/common/flags.h"
#include "examples/common/progress.h"
#include "examples/common/training_flags.h"
#include "examples/translator/translator_app.h"
#include "plugin/support/timing.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <deque>
#include <iostream>

namespace conveyor::examples {

namespace {

void print_plan(const TranslatorConfig& c, const Pipeline& pipe, const Translator& model, int64_t batches_per_epoch,
                bool synchronous) {
  int64_t parameters = 0;
  for (const auto& p : pipe.parameters()) parameters += p.numel();
  std::cout << "model: " << format_count(double(parameters)) << " parameters in " << model.names.size()
            << " layers (embed " << c.embed << ", hidden " << c.hidden << ", projection "
            << (c.tie ? "tied to the target embedding" : "untied") << "), " << pipe.num_stages() << " stages, "
            << pipe.schedule().num_microbatches << " micro-batches per batch, " << c.threads
            << " intra-op thread(s) per stage\n";
  for (const auto& s : pipe.split().stages) {
    std::cout << "  stage on " << s.device << ": layers [" << s.begin << ", " << s.end << ")";
    for (int64_t i = s.begin; i < s.end; ++i) std::cout << (i == s.begin ? " " : ", ") << model.names[i];
    std::cout << "\n";
  }
  const std::string schedule = pipe.schedule().str();
  std::cout << "schedule:\n"
            << schedule << (schedule.ends_with("\n") ? "" : "\n") << "training: " << c.steps << " batches of up to "
            << c.batch << " pairs from one length bucket each (" << batches_per_epoch << " per epoch), "
            << (synchronous ? "Adam lr " + fixed(c.lr, 4) + ", gradient norm clipped to " + fixed(c.clip, 2)
                            : "an Adam per stage stepped after every micro-batch, lr " + fixed(c.lr, 4) +
                                  ", each update clipped to " + fixed(c.clip, 2))
            << ", autocast " << c.autocast
            << ", dropout " << c.dropout << "\n"
            << std::flush;
}

// pipeline_options(), or with --plan auto a search on the profile of the
// first batch's first micro-batch (micro-batches are made by length
// buckets, so no one sample batch splits as a step does).
PipelineOptions planned_options(const TranslatorConfig& c, const LoadedCorpus& corpus, const Translator& model) {
  PipelineOptions options = pipeline_options(c, model, /*own_optimizer=*/false);
  if (c.plan != "auto") return options;
  TrainBatches first(corpus, c.batch, c.microbatches, static_cast<uint64_t>(c.seed));
  const TranslationBatch m = make_microbatches(corpus.data.encoded[0], first.next(), c.microbatches).front();
  options.profile(std::make_shared<ModelProfile>(profile_model(model.layers, m.inputs, m.targets, translation_loss)))
      .optimizer_state_per_weight(2);  // Adam
  options.plan(PlanMode::kAuto).max_workers(static_cast<int>(c.stages)).memory_budget(c.memory_budget << 20);
  return options.boundaries({});  // the search chooses the cut
}

}  // namespace

int run_translator(const TranslatorConfig& c) {
  const auto started = Clock::now();
  const LoadedCorpus corpus = load_corpus(c, true);
  torch::manual_seed(static_cast<uint64_t>(c.seed));
  Translator model = make_translator(translator_shape(c, corpus.data));
  const bool synchronous =
      schedules::make_schedule(c.schedule, static_cast<int>(c.stages), static_cast<int>(c.microbatches)).synchronous();
  Pipeline pipe(model.layers, {.options = planned_options(c, corpus, model), .batch_size = c.batch});
  if (c.plan == "auto") std::cout << "--plan auto: " << pipe.plan_text();
  const int64_t microbatches = pipe.schedule().num_microbatches;  // --plan auto's, or --microbatches
  TrainBatches batches(corpus, c.batch, microbatches, static_cast<uint64_t>(c.seed));
  print_plan(c, pipe, model, batches.per_epoch(), synchronous);

  const std::vector<at::Tensor> params = pipe.parameters();
  torch::optim::Adam optimizer(params, torch::optim::AdamOptions(c.lr));
  ProgressBar progress(std::cerr, c.steps, ProgressBar::stderr_is_tty(), tail_steps(c.steps));
  pipe.train();
  double start_loss = 0, train_seconds = 0, eval_seconds = 0;
  int64_t tokens = 0, sentences = 0;
  std::deque<double> recent;
  StepResult last;
  for (int64_t step = 1; step <= c.steps; ++step) {
    const auto t0 = Clock::now();
    std::vector<Tensors> inputs, targets;
    for (auto& m : make_microbatches(corpus.data.encoded[0], batches.next(), microbatches)) {
      inputs.push_back(std::move(m.inputs));
      targets.push_back(std::move(m.targets));
      tokens += m.target_tokens;
      sentences += m.sentences;
    }
    if (synchronous) optimizer.zero_grad();
    last = pipe.train_microbatches(inputs, targets, translation_loss);
    if (synchronous) {
      if (c.clip > 0) pipe.clip_grad_norm(c.clip);  // the global norm, each tied weight once
      optimizer.step();
    }
    train_seconds += seconds_since(t0);
    if (!std::isfinite(last.loss)) {
      progress.finish();
      std::cerr << "translator: the loss became " << last.loss << " at step " << step << "; try a smaller --lr\n";
      return 1;
    }
    if (step == 1) start_loss = last.loss;
    recent.push_back(last.loss);
    if (static_cast<int64_t>(recent.size()) > tail_steps(c.steps)) recent.pop_front();
    progress.update(step, last.loss, static_cast<double>(tokens) / train_seconds);
    if ((c.eval_every > 0 && step % c.eval_every == 0) || step == c.steps) {
      const auto t1 = Clock::now();
      const double valid = mean_loss(model.layers, corpus.data.encoded[1], corpus.bounds, c.batch);
      eval_seconds += seconds_since(t1);
      progress.note("  step " + std::to_string(step) + ": valid loss " + fixed(valid, 3) + " (perplexity " +
                    fixed(std::exp(valid), 1) + ")");
    }
  }
  progress.finish();
  double end_loss = 0;
  for (const double l : recent) end_loss += l / static_cast<double>(recent.size());
  std::cout << "result:\n  train loss " << fixed(start_loss, 3) << " at the first step -> " << fixed(end_loss, 3)
            << " (mean of the last " << recent.size() << " steps)\n  throughput: "
            << format_count(static_cast<double>(sentences) / train_seconds) << " pairs/s, "
            << format_count(static_cast<double>(tokens) / train_seconds) << " target tokens/s; last step "
            << fixed(last.wall_seconds, 3) << " s, bubble " << fixed(100 * last.bubble_fraction, 1) << "%, "
            << format_count(static_cast<double>(boundary_bytes(last))) << " bytes across the boundaries"
            << "; training " << format_duration(train_seconds) << "\n"
            << std::flush;
  std::pair<double, double> bleu;
  if (c.bleu) {
    const auto t2 = Clock::now();
    bleu = evaluate_bleu(c, corpus, model.layers);
    eval_seconds += seconds_since(t2);
  }
  std::cout << "  evaluation " << format_duration(eval_seconds) << ", total " << format_duration(seconds_since(started))
            << "\n";
  return verdict(c, start_loss, end_loss, c.bleu ? &bleu : nullptr);
}

}  // namespace conveyor::examples
