// lm_pipeline: trains a word-level LSTM language model as a pipeline of
// stages (conveyor::Pipeline) on English text, evaluates it against a unigram
// baseline, and fails (exit 1) if it does not beat that baseline.
// Run with --help for what it does, where its data comes from and its flags.

#include "examples/common/flags.h"
#include "examples/common/lm_model.h"
#include "examples/common/progress.h"
#include "examples/common/text_corpus.h"
#include "plugin/conveyor.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace ex = conveyor::examples;

namespace {

constexpr const char* kFortuneDir = "/usr/share/games/fortunes";
constexpr uint64_t kSplitSeed = 2718281828;  // fixed, so every --seed trains and evaluates on the same split
// The output bias starts at the unigram log-frequencies, so the model starts
// near the baseline: passing asks for a clear gain from context on top.
constexpr double kRequiredGain = 0.2;  // nats per word: perplexity at least 18% below the baseline's

constexpr const char* kHelp = R"(lm_pipeline: train a word-level LSTM language model as a pipeline.

The model, embedding -> dropout -> LSTM -> dropout -> LSTM -> dropout -> linear,
is cut into stages run by --workers threads (each on its own GPU when there
are GPUs), one stage each (--chunks each under an interleaved schedule).
By default the cut balances measured time: each layer
is profiled on one micro-batch first, and the plan printed with its predicted
per-stage times, step time and bubble (and, when one layer alone bounds the
speed, which one and the best speed-up any split can give). Each batch is split into --microbatches micro-batches that
flow through the stages under a --schedule, with the gradients of the unsplit
model. It ends with the valid and test perplexity next to a unigram baseline
and exits with 1 unless the valid loss is at least 0.2 nats below the
baseline's (perplexity 18% lower).

Data: by default the English quotations of Debian's 'fortunes' package
(/usr/share/games/fortunes, about 2.5 MB; scripts/setup.sh installs it). Text is
lower-cased and split into words and punctuation, <eos> ends each fortune, and
a hash of each fortune's text puts it in train, valid or test (about 90/5/5).
With --data DIR: PTB-format DIR/ptb.{train,valid,test}.txt (one sentence a line,
words separated by spaces, rare words as <unk>), <eos> ending each line. The
vocabulary is the --vocab most frequent train words; the rest read <unk>.

Training: Adam on the mean cross-entropy (nats per word; perplexity = exp) of
[--batch, --bptt] windows of the train split laid out as --batch parallel
streams, targets shifted by one word; gradients clipped to a global norm of
--clip; each window starts from a zero LSTM state. The output bias starts at
the log word frequencies of the train split, so training starts near the
unigram loss and goes straight to learning from context.

Flags (--flag VALUE or --flag=VALUE):
  --workers N       pipeline workers (threads), 1..7 (default 2)
  --microbatches N  micro-batches per batch, at most --batch (default 4)
  --schedule NAME   synchronous: sequential | gpipe | 1f1b (default 1f1b) |
                    interleaved (--chunks stages per worker) | zb-h1
                    (zero bubble: backwards split into input and weight
                    gradients) | zb-interleaved; asynchronous (an update per
                    micro-batch, by an Adam per stage, no clipping):
                    pipedream | ddg | fr
  --chunks N        stages per worker for the interleaved schedules
                    (default 2)
  --recompute       keep only each stage's inputs between a forward and its
                    backward, which replays the forward (less memory)
  --offload         as --recompute, the inputs waiting in host memory (on a
                    GPU; on the CPU it is --recompute)
  --steps N         training steps, one window each (default 400)
  --balance B       how to cut: time (default; profiled) | uniform (layer
                    counts) | flops (an estimate of each layer's arithmetic)
  --plan P          given (default): the flags decide | auto: search workers
                    (up to --workers), synchronous schedule, chunks, micro-
                    batches, recomputation and split for the fastest step |
                    tuned: then time the 6 predicted fastest, take the fastest
  --memory-budget N with --plan auto or tuned: MiB a worker may hold (any)
  --device D        auto (default): cuda when available, else cpu | cpu |
                    cuda: worker k on cuda:(k mod GPU count)
  --threads N       intra-op CPU threads of each worker (default cores / workers)
  --batch N         parallel streams per window (default 32)
  --bptt N          words per window (default 35)
  --embed N         embedding width (default 128)
  --hidden N        LSTM width (default 256)
  --vocab N         vocabulary size including <unk> (default 10000)
  --dropout P       dropout probability in [0, 1) (default 0.2)
  --lr X            Adam learning rate (default 0.005)
  --clip X          gradient-norm limit, 0 for none (default 1)
  --eval-every N    steps between valid evaluations, 0: at the end (default 100)
  --data DIR        PTB-format data instead of the fortunes
  --seed N          seed of the initial weights and dropout (default 1)
  --trace FILE      write the Chrome trace (Perfetto, chrome://tracing) of the
                    last training step to FILE
  --timeline FILE   draw the last training step, predicted above measured, to
                    FILE (an .svg)
  --help            this text

Exit status: 0 when the valid loss beats the unigram baseline by 0.2 nats, 1
when it does not or training fails, 2 for invalid flags or missing data.
Example: lm_pipeline --workers 2 --microbatches 8 --schedule gpipe --steps 200
)";

using ex::UsageError;

struct Config {
  int64_t workers = 2, microbatches = 4, steps = 400, threads = 0, chunks = 0;
  bool recompute = false, offload = false;
  std::string schedule = "1f1b", device = "auto", data, trace, balance = "time", timeline;
  int64_t memory_budget = 0;      // MiB
  conveyor::PipelineOptions planning;  // --plan, and the search's bounds
  int64_t batch = 32, bptt = 35, embed = 128, hidden = 256, vocab = 10000, eval_every = 100, seed = 1;
  double dropout = 0.2, lr = 5e-3, clip = 1.0;
};

// Returns false when --help was asked for.
bool parse_args(int argc, char** argv, Config& c) {
  constexpr int64_t kBig = 1'000'000'000;
  ex::Flags flags;
  flags.integer("--workers", &c.workers, 1, 7).integer("--microbatches", &c.microbatches, 1, kBig);
  flags.renamed("--stages", "--workers", "a stage is a piece of the model, a worker the thread that runs stages");
  flags.integer("--steps", &c.steps, 1, kBig).integer("--threads", &c.threads, 1, 1024);
  flags.integer("--batch", &c.batch, 1, kBig).integer("--bptt", &c.bptt, 1, kBig);
  flags.integer("--embed", &c.embed, 1, kBig).integer("--hidden", &c.hidden, 1, kBig);
  flags.integer("--vocab", &c.vocab, 2, kBig).integer("--eval-every", &c.eval_every, 0, kBig);
  flags.integer("--seed", &c.seed, 0, INT64_MAX);
  flags.real("--dropout", &c.dropout, 0.0, 1.0, /*max_included=*/false).real("--lr", &c.lr, 1e-12, 1e3, false);
  flags.real("--clip", &c.clip, 0.0, 1e9, false);
  flags.text("--schedule", &c.schedule).text("--device", &c.device).text("--data", &c.data).text("--trace", &c.trace);
  flags.text("--balance", &c.balance).text("--timeline", &c.timeline).integer("--chunks", &c.chunks, 1, 16);
  flags.toggle("--recompute", &c.recompute).toggle("--offload", &c.offload).option("--plan", &c.planning, "plan");
  flags.integer("--memory-budget", &c.memory_budget, 1, kBig);
  if (!flags.parse(argc, argv)) return false;
  if (c.planning.plan() != conveyor::PlanMode::kGiven) c.planning.max_workers(static_cast<int>(c.workers));
  c.planning.memory_budget(c.memory_budget << 20);
  if (c.balance != "time" && c.balance != "uniform" && c.balance != "flops") {
    throw UsageError("--balance expects time, uniform or flops, got '" + c.balance + "'");
  }
  const auto& names = conveyor::schedules::schedule_names();
  if (std::find(names.begin(), names.end(), c.schedule) == names.end()) {
    std::string all;
    for (const auto& n : names) all += (all.empty() ? "" : " | ") + n;
    throw UsageError("--schedule expects one of " + all + ", got '" + c.schedule + "'");
  }
  if (c.device != "cpu" && c.device != "cuda" && c.device != "auto") {
    throw UsageError("--device expects cpu, cuda or auto, got '" + c.device + "'");
  }
  if (c.microbatches > c.batch) {
    throw UsageError("--microbatches (" + std::to_string(c.microbatches) + ") cannot exceed --batch (" +
                     std::to_string(c.batch) + "): every micro-batch needs at least one stream");
  }
  return true;
}

// The stage devices for --device; throws UsageError when CUDA is asked for and absent.
std::vector<std::string> stage_devices(const Config& c) {
  const bool cuda = torch::cuda::is_available();
  if (c.device == "cpu" || (c.device == "auto" && !cuda)) return {"cpu"};
  if (!cuda) throw UsageError("--device cuda: no CUDA device is available (use --device cpu or auto)");
  const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
  std::vector<std::string> devices;
  for (int64_t k = 0; k < c.workers; ++k) devices.push_back("cuda:" + std::to_string(k % count));
  return devices;
}

using ex::fixed;
using ex::window_tensors;

struct Data {
  ex::Corpus corpus;
  ex::TokenGrid train, valid, test;
  ex::UnigramBaseline valid_baseline, test_baseline;
};

// Reads the corpus, lays it out in windows and prints what was read.
Data load_data(const Config& c) {
  Data d;
  try {
    d.corpus = c.data.empty() ? ex::load_fortunes(kFortuneDir, c.vocab, kSplitSeed) : ex::load_ptb(c.data, c.vocab);
  } catch (const std::exception& e) {
    throw UsageError(std::string(e.what()) +
                     (c.data.empty() ? "\n  install Debian's 'fortunes' package (scripts/setup.sh does, or "
                                       "'sudo apt-get install fortunes') or pass --data DIR with PTB-format files"
                                     : ""));
  }
  const ex::Corpus& corpus = d.corpus;
  const int64_t vocab = corpus.vocab.size();
  d.valid_baseline = ex::unigram_baseline(corpus.train, corpus.valid, vocab);
  d.test_baseline = ex::unigram_baseline(corpus.train, corpus.test, vocab);
  try {
    d.train = ex::batchify(corpus.train, c.batch, "train");
    d.valid = ex::batchify(corpus.valid, c.batch, "valid");
    d.test = ex::batchify(corpus.test, c.batch, "test");
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string(e.what()) + " (--batch " + std::to_string(c.batch) + ")");
  }
  const auto unk_share = [&](const std::vector<int64_t>& ids) {
    return fixed(100.0 * static_cast<double>(std::count(ids.begin(), ids.end(), 0)) / static_cast<double>(ids.size()),
                 1);
  };
  std::cout << "data: " << corpus.source << "\n  words: train " << ex::format_count(corpus.train.size()) << ", valid "
            << ex::format_count(corpus.valid.size()) << ", test " << ex::format_count(corpus.test.size()) << " ("
            << (c.data.empty() ? "fortunes " : "lines ") << corpus.train_entries << " / " << corpus.valid_entries
            << " / " << corpus.test_entries << ")\n  vocabulary: " << vocab << " of "
            << ex::format_count(corpus.distinct_train_words) << " distinct train words; <unk> is "
            << unk_share(corpus.train) << "% of train, " << unk_share(corpus.valid) << "% of valid\n"
            << "  unigram baseline (train counts, add-one): valid loss " << fixed(d.valid_baseline.cross_entropy, 3)
            << " nats, perplexity " << fixed(d.valid_baseline.perplexity(), 1) << "; train unigram entropy "
            << fixed(d.valid_baseline.train_entropy, 3) << " nats\n";
  return d;
}

const conveyor::TensorsLossFn kLoss = [](const conveyor::Tensors& out, const conveyor::Tensors& target) {
  return ex::lm_loss(out[0], target[0]);
};

// Synchronous schedules: the caller clips and steps one Adam over every
// weight. Asynchronous ones update after every micro-batch, so the pipeline
// steps its own Adam per stage (without clipping). Every --balance profiles
// the model on a micro-batch of the first window, for the plan's prediction.
conveyor::PipelineOptions pipeline_options(const Config& c, const ex::LanguageModel& model, const Data& data,
                                           const std::vector<std::string>& devices, bool& synchronous) {
  try {
    const int workers = static_cast<int>(c.workers), microbatches = static_cast<int>(c.microbatches);
    const int chunks = static_cast<int>(c.chunks);
    const auto schedule = conveyor::schedules::make_schedule(c.schedule, workers, microbatches, false, chunks);
    synchronous = schedule.synchronous();
    auto options = conveyor::PipelineOptions().workers(workers).chunks(chunks).microbatches(microbatches);
    options.schedule(c.schedule).devices(devices).recompute(c.recompute).offload(c.offload).channel_capacity(4);
    if (c.balance == "time") options.balance(conveyor::Balance::kTime);
    if (c.balance == "uniform") options.balance(conveyor::Balance::kUniform);
    if (c.balance == "flops") options.boundaries(conveyor::balanced_boundaries(model.costs, schedule.num_stages));
    auto [input, target] = window_tensors(data.train, 0, c.bptt);
    const auto profile = conveyor::profile_first_microbatch(model.layers, {input}, {target}, kLoss, options,
                                                            conveyor::ProfileOptions().device(devices[0]));
    options.profile(std::make_shared<conveyor::ModelProfile>(profile)).optimizer_state_per_weight(2);  // Adam
    if (!synchronous) {
      options.optimizer([lr = c.lr](std::vector<at::Tensor> p) {
        return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(lr));
      });
    }
    return options;
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
}

void print_plan(const Config& c, const conveyor::Pipeline& pipe, const ex::LanguageModel& model, int64_t windows,
                bool synchronous, const conveyor::Prediction& plan) {
  const int64_t m = pipe.schedule().num_microbatches;
  int64_t num_params = 0;
  for (const auto& p : pipe.parameters()) num_params += p.numel();
  std::cout << "model: " << ex::format_count(num_params) << " parameters in " << model.names.size() << " layers, "
            << pipe.num_stages() << " stages on " << pipe.num_workers() << " workers"
            << ", " << m << " micro-batches of " << c.batch / m << (c.batch % m ? "+" : "") << " streams, "
            << c.threads << " intra-op thread(s) per worker\n";
  for (const auto& s : pipe.split().stages) {
    std::cout << "  stage on " << s.device << ": layers [" << s.begin << ", " << s.end << ")";
    for (int64_t i = s.begin; i < s.end; ++i) std::cout << (i == s.begin ? " " : ", ") << model.names[i];
    std::cout << "\n";
  }
  std::cout << plan.str();
  const std::string schedule = pipe.schedule().str();
  std::cout << "schedule:\n"
            << schedule << (schedule.ends_with("\n") ? "" : "\n") << "training: " << c.steps << " steps of " << c.batch
            << " x " << c.bptt << " words (" << fixed(double(c.steps) / double(windows), 2)
            << " passes over the train split), " << (synchronous ? "Adam" : "an Adam per stage and micro-batch")
            << " lr " << c.lr << ", clip " << (synchronous ? fixed(c.clip, 2) : "none") << ", dropout " << c.dropout
            << "\n"
            << std::flush;
}

int run(const Config& c) {
  using clock = std::chrono::steady_clock;
  const auto started = clock::now();
  auto seconds_since = [](clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); };

  const auto devices = stage_devices(c);  // fails fast on a missing GPU
  const Data data = load_data(c);
  ex::LanguageModel model =
      ex::make_language_model(static_cast<int64_t>(data.corpus.vocab.size()), c.embed, c.hidden, c.dropout);
  ex::init_decoder_bias(model.decoder, data.corpus.train, data.corpus.vocab.size());
  bool synchronous = true;
  const auto [first_input, first_target] = window_tensors(data.train, 0, c.bptt);
  const conveyor::PlanMode mode = c.planning.plan();
  const auto options = pipeline_options(c, model, data, devices, synchronous)
                           .plan(mode).max_workers(c.planning.max_workers()).memory_budget(c.planning.memory_budget());
  conveyor::Pipeline pipe(model.layers, {.options = options, .loss = kLoss,
                                         .sample = conveyor::SampleBatch{{first_input}, {first_target}}});
  if (mode != conveyor::PlanMode::kGiven) std::cout << "--plan " << value_name(mode) << ": " << pipe.plan_text();
  const conveyor::Prediction plan = *pipe.prediction();
  const int64_t windows = data.train.num_windows(c.bptt);
  print_plan(c, pipe, model, windows, synchronous, plan);

  const auto params = pipe.parameters();
  torch::optim::Adam optimizer(params, torch::optim::AdamOptions(c.lr));
  ex::ProgressBar progress(std::cerr, c.steps, ex::ProgressBar::stderr_is_tty(),
                           std::clamp<int64_t>(c.steps / 10, 1, 50));
  pipe.train();
  conveyor::StepResult last;
  double start_loss = 0, train_seconds = 0, eval_seconds = 0, valid_loss = 0;
  int64_t words_trained = 0;
  std::vector<double> recent;  // losses of the last steps, for the final train loss
  for (int64_t step = 1; step <= c.steps; ++step) {
    const auto t0 = clock::now();
    auto [input, target] = window_tensors(data.train, (step - 1) % windows, c.bptt);
    if (synchronous) optimizer.zero_grad();
    last = pipe.train_step(input, target, ex::lm_loss);
    if (synchronous) {
      ex::clip_global_norm(params, c.clip);
      optimizer.step();
    }
    train_seconds += seconds_since(t0);
    words_trained += target.numel();
    if (!std::isfinite(last.loss)) {
      progress.finish();
      std::cerr << "lm_pipeline: the loss became " << last.loss << " at step " << step << "; try a smaller --lr\n";
      return 1;
    }
    if (step == 1) start_loss = last.loss;
    recent.push_back(last.loss);
    if (recent.size() > 50) recent.erase(recent.begin());
    progress.update(step, last.loss, static_cast<double>(words_trained) / train_seconds);
    if ((c.eval_every > 0 && step % c.eval_every == 0) || step == c.steps) {
      const auto t1 = clock::now();
      valid_loss = ex::evaluate(pipe, data.valid, c.bptt);
      eval_seconds += seconds_since(t1);
      progress.note("  step " + std::to_string(step) + ": valid loss " + fixed(valid_loss, 3) + ", perplexity " +
                    fixed(std::exp(valid_loss), 1) + " (unigram " + fixed(data.valid_baseline.perplexity(), 1) + ")");
    }
  }
  progress.finish();
  const auto t2 = clock::now();
  const double test_loss = ex::evaluate(pipe, data.test, c.bptt);
  eval_seconds += seconds_since(t2);
  if (!c.trace.empty()) last.write_chrome_trace(c.trace);

  double end_loss = 0;
  for (double l : recent) end_loss += l / static_cast<double>(recent.size());
  auto versus = [](double loss, const ex::UnigramBaseline& b) {
    return "loss " + fixed(loss, 3) + ", perplexity " + fixed(std::exp(loss), 1) + "   unigram baseline: loss " +
           fixed(b.cross_entropy, 3) + ", perplexity " + fixed(b.perplexity(), 1) + "\n";
  };
  std::cout << "result:\n  train loss: " << fixed(start_loss, 3) << " at the first step -> " << fixed(end_loss, 3)
            << " (mean of the last " << recent.size() << " steps)\n  valid: " << versus(valid_loss, data.valid_baseline)
            << "  test:  " << versus(test_loss, data.test_baseline) << "  last step: " << fixed(last.wall_seconds, 3)
            << " s, bubble " << fixed(100 * last.bubble_fraction, 1) << "%, busy per stage";
  for (size_t k = 0; k < last.busy_seconds.size(); ++k) {
    std::cout << (k ? ", " : " ") << fixed(last.busy_seconds[k], 3) << " s";
  }
  std::cout << "\n";
  std::cout << "  " << plan.versus(last);
  if (!c.timeline.empty()) plan.write_timeline(c.timeline, &last);
  if (!c.timeline.empty()) std::cout << "  timeline of the last step, predicted above measured: " << c.timeline << "\n";
  std::cout << "  throughput: " << ex::format_count(static_cast<double>(words_trained) / train_seconds)
            << " words/s; training " << ex::format_duration(train_seconds) << ", evaluation "
            << ex::format_duration(eval_seconds) << ", total " << ex::format_duration(seconds_since(started)) << "\n";
  if (!c.trace.empty()) std::cout << "  trace of the last step: " << c.trace << "\n";
  const double gain = data.valid_baseline.cross_entropy - valid_loss;
  const bool beat = gain >= kRequiredGain;
  std::cout << (beat ? "PASS" : "FAIL") << ": the valid loss " << fixed(valid_loss, 3) << " is "
            << fixed(std::fabs(gain), 3) << " nats " << (gain >= 0 ? "below" : "above") << " the unigram baseline's "
            << fixed(data.valid_baseline.cross_entropy, 3) << " (required: " << kRequiredGain << " below)"
            << (beat ? "" : "; train longer (--steps)") << "\n";
  return beat ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Config config;
  try {
    if (!parse_args(argc, argv, config)) {
      std::cout << kHelp;
      return 0;
    }
    const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
    if (config.threads == 0) config.threads = std::max<int64_t>(1, cores / config.workers);
    // Stage threads pick this up the first time they run an op.
    at::set_num_threads(static_cast<int>(config.threads));
    torch::manual_seed(static_cast<uint64_t>(config.seed));
    return run(config);
  } catch (const UsageError& e) {
    std::cerr << "lm_pipeline: " << e.what() << "\nRun 'lm_pipeline --help' for the flags and the data.\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "lm_pipeline: " << e.what() << "\n";
    return 1;
  }
}
