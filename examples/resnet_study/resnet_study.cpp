// resnet_study: naive sequential model parallelism, DDG, features replay and
// PipeDream (and GPipe, 1F1B) training a ResNet cut into 2, 3, 4, ... stages
// of whole blocks. Prints the best test accuracy per method and number of
// stages, the divergences per learning rate, and the time per epoch.
// Run with --help for the data, the flags and what is compared.

#include "examples/common/digits_data.h"
#include "examples/common/flags.h"
#include "examples/common/resnet.h"
#include "examples/common/study_tables.h"
#include "plugin/conveyor.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <numbers>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace ex = conveyor::examples;

#ifndef CONVEYOR_SOURCE_DIR  // the build defines it: the project's .venv is looked up there
#define CONVEYOR_SOURCE_DIR "."
#endif

namespace {

constexpr const char* kHelp = R"(resnet_study: model-parallel training methods on a ResNet, side by side.

A ResNet-(6n+2) for small images (stem conv, 3n basic blocks, pooling + linear
head) is a Sequential of whole blocks cut into --stages contiguous stages: a
boundary never falls inside a block; stages are balanced by multiply-adds.
Every (method, stages, learning rate) starts from the same initial weights,
sees the same mini-batches in the same order, and reports its best test top-1
accuracy over the epochs.

Methods: sequential (naive model parallelism, one mini-batch at a time), gpipe
and 1f1b (synchronous: the mini-batch is split into --sync-microbatches
micro-batches, batch norm then normalises per micro-batch), and the
asynchronous ddg (delayed gradients), fr (features replay) and pipedream
(weight stashing), which update every stage after every mini-batch.
Comparability: every method makes one update per mini-batch of --batch images,
the same updates per epoch, under the same learning-rate schedule. The
asynchronous methods run --microbatches mini-batches per pipeline step (the
pipeline fills and drains once per step).
Optimiser: SGD, momentum 0.9, weight decay 5e-4; the learning rate rises
linearly over --warmup epochs (none by default), then follows a cosine to 0.
A run diverges when a loss or gradient becomes non-finite
(conveyor::DivergenceError) or an epoch's mean train loss exceeds
--diverge-loss (batch norm often keeps an exploding network finite); it stops,
counts as diverged and is left out of the best accuracy.

Data: scikit-learn's digits (1,797 grey 8x8 images; the file ships inside the
scikit-learn package as sklearn/datasets/data/digits.csv.gz and is read with
'gzip -dc', no Python), upsampled bilinearly to --size, split with a fixed seed
into --train-count train images and the rest test. Without --digits the file
is looked up in $VIRTUAL_ENV, then in the project's .venv.
With --cifar DIR: CIFAR-10 binary files (data_batch_1..5.bin, test_batch.bin).

Flags (--flag VALUE or --flag=VALUE; lists are comma-separated):
  --stages LIST         numbers of stages, each at most 3n+2 (default 2,4,11)
  --methods LIST        of sequential,gpipe,1f1b,ddg,fr,pipedream
                        (default sequential,ddg,fr,pipedream)
  --lrs LIST            peak learning rates (default 0.05,0.2,2)
  --epochs N            (default 8)
  --batch N             images per mini-batch, i.e. per update (default 32)
  --microbatches N      mini-batches per step, asynchronous methods (default 16)
  --sync-microbatches N micro-batches per mini-batch, gpipe and 1f1b (default 4)
  --depth N             6n+2: 8, 14, 20 (ResNet-20, default), 32, ...
  --width N             channels of the first group (default 8; the paper's 16)
  --size N              digits upsampled to N x N, >= 8 (default 16)
  --train-count N       digits train images (default 1024; the rest test)
  --warmup E            epochs of linear learning-rate warm-up (default 0)
  --diverge-loss X      epoch train loss counted as divergence
                        (default 2 ln(classes): twice a uniform guess's)
  --seed N              initial weights and mini-batch order (default 1)
  --threads N           intra-op threads per stage (default cores / stages)
  --digits PATH         digits.csv.gz (or an uncompressed .csv)
  --cifar DIR           CIFAR-10 instead of the digits
  --train-limit N       CIFAR-10: a seeded subset of N train images (0: all)
  --test-limit N        CIFAR-10: a seeded subset of N test images (0: all)
  --help                this text
Time per epoch is the wall time of training here; every stage is a thread, so
on a CPU with fewer cores than stages it shows overheads, not the speed-ups
of one device per stage. Results are deterministic for a given --seed.
Exit status: 0 when every run ended (diverged or not), 1 on a failure, 2 for
invalid flags or missing data.
)";

using ex::fixed;
using ex::UsageError;

struct Config {
  std::vector<int64_t> stages = {2, 4, 11};
  std::vector<std::string> methods = {"sequential", "ddg", "fr", "pipedream"};
  std::vector<double> lrs = {0.05, 0.2, 2.0};
  int64_t epochs = 8, batch = 32, microbatches = 16, sync_microbatches = 4, depth = 20, width = 8, size = 16;
  int64_t train_count = 1024, seed = 1, threads = 0, train_limit = 0, test_limit = 0;
  double warmup_epochs = 0, diverge_loss = 0;  // 0: 2 ln(classes)
  std::string digits, cifar;
};

int64_t parse_count(const std::string& flag, const std::string& text, int64_t min, int64_t max) {
  const double v = ex::parse_real(flag, text, static_cast<double>(min), static_cast<double>(max));
  if (v != std::floor(v)) throw UsageError(flag + " expects an integer, got '" + text + "'");
  return static_cast<int64_t>(v);
}

// Returns false when --help was asked for.
bool parse_args(int argc, char** argv, Config& c) {
  constexpr int64_t kBig = 1'000'000'000;
  struct Count {
    int64_t* value;
    int64_t min, max;
  };
  const std::map<std::string, Count> counts = {{"--epochs", {&c.epochs, 1, kBig}},
                                               {"--batch", {&c.batch, 1, kBig}},
                                               {"--microbatches", {&c.microbatches, 1, 4096}},
                                               {"--sync-microbatches", {&c.sync_microbatches, 1, 4096}},
                                               {"--depth", {&c.depth, 8, 1000}},
                                               {"--width", {&c.width, 1, 4096}},
                                               {"--size", {&c.size, 8, 1024}},
                                               {"--train-count", {&c.train_count, 1, kBig}},
                                               {"--seed", {&c.seed, 0, kBig}},
                                               {"--threads", {&c.threads, 1, 1024}},
                                               {"--train-limit", {&c.train_limit, 0, kBig}},
                                               {"--test-limit", {&c.test_limit, 0, kBig}}};
  const std::vector<std::string> methods = {"sequential", "gpipe", "1f1b", "ddg", "fr", "pipedream"};
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    if (flag == "--help" || flag == "-h") return false;
    if (const size_t eq = flag.find('='); flag.starts_with("--") && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag.resize(eq);
    } else if (flag.starts_with("--") && i + 1 < argc) {
      value = argv[++i];
    } else {
      throw UsageError(flag.starts_with("--") ? flag + " needs a value" : "unexpected argument '" + flag + "'");
    }
    if (const auto it = counts.find(flag); it != counts.end()) {
      *it->second.value = parse_count(flag, value, it->second.min, it->second.max);
    } else if (flag == "--stages") {
      c.stages.clear();
      for (const auto& s : ex::split_list(flag, value)) c.stages.push_back(parse_count(flag, s, 1, 1000));
    } else if (flag == "--methods") {
      c.methods = ex::split_list(flag, value);
      for (const auto& m : c.methods) {
        if (std::find(methods.begin(), methods.end(), m) == methods.end()) {
          throw UsageError("--methods: unknown method '" + m + "' (sequential, gpipe, 1f1b, ddg, fr, pipedream)");
        }
      }
    } else if (flag == "--lrs") {
      c.lrs.clear();
      for (const auto& s : ex::split_list(flag, value)) c.lrs.push_back(ex::parse_real(flag, s, 1e-9, 1e3));
    } else if (flag == "--warmup" || flag == "--diverge-loss") {
      (flag == "--warmup" ? c.warmup_epochs : c.diverge_loss) = ex::parse_real(flag, value, 0, 1e9);
    } else if (flag == "--digits" || flag == "--cifar") {
      (flag == "--digits" ? c.digits : c.cifar) = value;
    } else {
      throw UsageError("unknown flag '" + flag + "'");
    }
  }
  if (c.sync_microbatches > c.batch) {
    throw UsageError("--sync-microbatches (" + std::to_string(c.sync_microbatches) + ") cannot exceed --batch (" +
                     std::to_string(c.batch) + "): each micro-batch needs an image");
  }
  return true;
}

using ex::pad;
using ex::shortest;

ex::ImageData load_data(const Config& c) {
  try {
    if (!c.cifar.empty()) return ex::load_cifar10(c.cifar, c.train_limit, c.test_limit, static_cast<uint64_t>(c.seed));
    std::string path = c.digits;
    for (const char* venv :
         std::initializer_list<const char*>{std::getenv("VIRTUAL_ENV"), CONVEYOR_SOURCE_DIR "/.venv"}) {
      if (path.empty() && venv) path = ex::find_digits_in_venv(venv);
    }
    if (path.empty()) {
      throw std::runtime_error("cannot find scikit-learn's digits.csv.gz in $VIRTUAL_ENV or " CONVEYOR_SOURCE_DIR
                               "/.venv: install scikit-learn (pip install scikit-learn) or pass --digits PATH");
    }
    return ex::load_digits(path, c.size, c.train_count, /*split_seed=*/20190621);
  } catch (const std::exception& e) {
    throw UsageError(e.what());
  }
}

double test_accuracy(conveyor::Pipeline& pipe, const ex::ImageSet& test, int64_t microbatches) {
  pipe.eval();
  torch::NoGradGuard no_grad;
  int64_t correct = 0;
  const int64_t chunks = std::max<int64_t>(1, test.size() / std::max<int64_t>(512, microbatches));
  const auto images = test.images.tensor_split(chunks), labels = test.labels.tensor_split(chunks);
  for (size_t i = 0; i < images.size(); ++i) {
    correct += pipe.forward(images[i]).argmax(1).cpu().eq(labels[i]).sum().item<int64_t>();
  }
  pipe.train();
  return 100.0 * static_cast<double>(correct) / static_cast<double>(test.size());
}

// Linear warm-up to `peak` over `warmup` updates, then a cosine to 0 at update `total`.
double learning_rate(double peak, int64_t n, int64_t warmup, int64_t total) {
  if (n < warmup) return peak * static_cast<double>(n + 1) / static_cast<double>(warmup);
  const double progress = static_cast<double>(n - warmup) / static_cast<double>(std::max<int64_t>(1, total - warmup));
  return 0.5 * peak * (1.0 + std::cos(std::numbers::pi * std::min(1.0, progress)));
}

ex::Run train_one(const Config& c, const ex::ImageData& data, const ex::ResNetConfig& net, const std::string& method,
                  int64_t stages, double lr) {
  const bool async = !conveyor::schedules::make_schedule(method, 1, 1).synchronous();
  const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  at::set_num_threads(static_cast<int>(c.threads > 0 ? c.threads : std::max<int64_t>(1, cores / stages)));
  torch::manual_seed(static_cast<uint64_t>(c.seed));  // the same initial weights for every run
  const torch::nn::Sequential model = ex::make_resnet(net);
  // Updates per epoch: whole pipeline steps of the asynchronous methods, for every method.
  const int64_t per_epoch = data.train.size() / (c.microbatches * c.batch) * c.microbatches;
  const int64_t per_step = async ? c.microbatches : 1;  // mini-batches (updates) per train_step
  const int64_t total = per_epoch * c.epochs;
  const auto warmup = static_cast<int64_t>(std::llround(c.warmup_epochs * static_cast<double>(per_epoch)));
  const int64_t microbatches = async ? c.microbatches : method == "sequential" ? 1 : c.sync_microbatches;
  conveyor::Pipeline pipe(
      model, conveyor::PipelineOptions()
                 .workers(static_cast<int>(stages))
                 .boundaries(ex::resnet_boundaries(net, static_cast<int>(stages)))
                 .schedule(method)
                 .microbatches(static_cast<int>(microbatches))
                 .trace(false)
                 .optimizer([lr](std::vector<at::Tensor> p) {
                   return std::make_unique<torch::optim::SGD>(
                       p, torch::optim::SGDOptions(lr).momentum(0.9).weight_decay(5e-4));
                 })
                 .lr_schedule([=](int64_t n) { return learning_rate(lr, n, warmup, total); })
                 .lr_schedule_unit(async ? conveyor::UpdateUnit::kMicrobatch : conveyor::UpdateUnit::kBatch));
  const auto loss_fn = [](const at::Tensor& out, const at::Tensor& target) {
    return torch::nn::functional::cross_entropy(out, target);
  };
  const double diverge_loss = c.diverge_loss > 0 ? c.diverge_loss : 2 * std::log(static_cast<double>(data.classes));
  ex::Run run;
  run.method = method;
  run.stages = stages;
  run.lr = lr;
  double train_seconds = 0;
  for (int64_t epoch = 1; epoch <= c.epochs && !run.diverged(); ++epoch) {
    // Seeded by the seed and the epoch only: the same mini-batches for every run.
    const at::Tensor order = torch::tensor(
        ex::seeded_permutation(data.train.size(), static_cast<uint64_t>(c.seed) * 1000003 + epoch), torch::kLong);
    const auto t0 = std::chrono::steady_clock::now();
    double loss_sum = 0;
    try {
      for (int64_t s = 0; s < per_epoch / per_step; ++s) {
        const at::Tensor take = order.narrow(0, s * per_step * c.batch, per_step * c.batch);
        loss_sum += per_step * pipe.train_step(data.train.images.index_select(0, take),
                                               data.train.labels.index_select(0, take), loss_fn)
                                   .loss;
      }
    } catch (const conveyor::DivergenceError& e) {
      run.why = "a non-finite loss or gradient on stage " + std::to_string(e.stage());
    }
    train_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (run.why.empty() && loss_sum / static_cast<double>(per_epoch) > diverge_loss) {
      run.why =
          "mean train loss " + fixed(loss_sum / static_cast<double>(per_epoch), 2) + " > " + fixed(diverge_loss, 2);
    }
    if (!run.why.empty()) {
      run.diverged_epoch = epoch;
      break;
    }
    run.last_loss = loss_sum / static_cast<double>(per_epoch);
    run.seconds_per_epoch = train_seconds / static_cast<double>(epoch);
    const double accuracy = test_accuracy(pipe, data.test, microbatches);
    if (accuracy > run.best_accuracy) {
      run.best_accuracy = accuracy;
      run.best_epoch = epoch;
    }
  }
  return run;
}

// Checks the configuration against the data and the network, and says what will run.
void print_setup(const Config& c, const ex::ImageData& data, const ex::ResNetConfig& net) {
  std::vector<ex::ResNetElement> elements;
  try {
    elements = ex::resnet_elements(net);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--depth/--width: ") + e.what());
  }
  for (int64_t k : c.stages) {
    if (k > static_cast<int64_t>(elements.size())) {
      throw UsageError("--stages " + std::to_string(k) + ": a ResNet-" + std::to_string(c.depth) + " has only " +
                       std::to_string(elements.size()) + " elements (stem, blocks, head) to place on stages");
    }
  }
  const int64_t per_epoch = data.train.size() / (c.microbatches * c.batch) * c.microbatches;
  if (per_epoch == 0) {
    throw UsageError("--microbatches x --batch (" + std::to_string(c.microbatches * c.batch) + ") exceeds the " +
                     std::to_string(data.train.size()) + " train images");
  }
  for (const auto& m : c.methods) {
    const bool async = !conveyor::schedules::make_schedule(m, 1, 1).synchronous();
    for (int64_t k : c.stages) {
      if (async && k > c.microbatches) {
        throw UsageError(m + " with " + std::to_string(k) + " stages needs --microbatches of at least " +
                         std::to_string(k) + " (got " + std::to_string(c.microbatches) + "): the pipeline must fill");
      }
    }
  }
  if (data.test.size() < c.microbatches) {
    throw UsageError("the test split (" + std::to_string(data.test.size()) + " images) is smaller than --microbatches");
  }
  torch::manual_seed(static_cast<uint64_t>(c.seed));
  int64_t params = 0;
  for (const auto& p : ex::make_resnet(net)->parameters()) params += p.numel();
  std::cout << "data: " << data.source << "\n  train " << data.train.size() << ", test " << data.test.size()
            << " images of " << data.channels << "x" << data.image_size << "x" << data.image_size << "\nmodel: ResNet-"
            << c.depth << ", width " << c.width << ", " << params << " parameters, " << elements.size() << " elements:";
  for (const auto& e : elements) std::cout << " " << e.name;
  std::cout << "\npartitions (the first element of stages 1..K-1):\n";
  for (int64_t k : c.stages) {
    std::cout << "  " << k << " stages:";
    for (int64_t b : ex::resnet_boundaries(net, static_cast<int>(k))) std::cout << " " << b;
    std::cout << "\n";
  }
  const int64_t idle = data.train.size() - per_epoch * c.batch;
  std::cout << "training: " << c.epochs << " epochs of " << per_epoch << " updates, each on a mini-batch of " << c.batch
            << " images"
            << (idle ? " (another " + std::to_string(idle) + " train images, a new draw each epoch, sit it out)" : "")
            << "; asynchronous methods: " << c.microbatches << " mini-batches (updates) per pipeline step; "
            << "gpipe/1f1b: " << c.sync_microbatches << " micro-batches per mini-batch\n  SGD momentum 0.9, weight "
            << "decay 5e-4, " << shortest(c.warmup_epochs) << " epoch(s) of linear warm-up, then a cosine to 0; "
            << "divergence: a non-finite loss or gradient, or an epoch's mean train loss above "
            << fixed(c.diverge_loss > 0 ? c.diverge_loss : 2 * std::log(static_cast<double>(data.classes)), 2)
            << "; seed " << c.seed << "\n\n"
            << std::flush;
}

int run(const Config& c) {
  const auto started = std::chrono::steady_clock::now();
  const ex::ImageData data = load_data(c);
  const ex::ResNetConfig net{c.depth, c.width, data.channels, data.image_size, data.classes};
  print_setup(c, data, net);
  std::vector<ex::Run> runs;
  for (const auto& method : c.methods) {
    for (int64_t k : c.stages) {
      for (double lr : c.lrs) {
        runs.push_back(train_one(c, data, net, method, k, lr));
        std::cout << pad(method, 11) << pad("stages " + std::to_string(k), 10) << pad("lr " + shortest(lr), 9)
                  << ex::describe(runs.back()) << "\n"
                  << std::flush;
      }
    }
  }
  ex::print_tables(c.stages, c.lrs, c.methods, runs);
  std::cout << "\ntotal time "
            << fixed(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), 1) << " s\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config config;
  try {
    if (!parse_args(argc, argv, config)) {
      std::cout << kHelp;
      return 0;
    }
    return run(config);
  } catch (const UsageError& e) {
    std::cerr << "resnet_study: " << e.what() << "\nRun 'resnet_study --help' for the flags and the data.\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "resnet_study: " << e.what() << "\n";
    return 1;
  }
}
