#include "predict_table.h"

#include "bench_models.h"
#include "examples/bert/bert_data.h"
#include "examples/bert/bert_model.h"
#include "examples/translator/translator_model.h"
#include "plugin/conveyor.h"
#include "plugin/support/timing.h"

#include <torch/torch.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace conveyor::bench {

namespace {

// A model (built afresh, the same weights each time), a batch and its loss.
struct PredictWorkload {
  std::function<torch::nn::Sequential()> model;
  Tensors x, y;
  TensorsLossFn loss;
  std::vector<std::string> tied;  // one logical weight's parameter names (synchronous schedules)
};

// Sequences of 32 pieces, 16 to 32 of them real, 15 % of those predicted.
PredictWorkload bert_workload(int64_t batch) {
  const examples::BertConfig config;
  const at::Tensor tokens = torch::randint(5, config.vocab, {batch, 32});
  const at::Tensor lengths = torch::randint(16, 33, {batch, 1});
  const at::Tensor padding = torch::arange(32).unsqueeze(0).ge(lengths);
  const at::Tensor asked = torch::rand({batch, 32}).lt(0.15).logical_and(padding.logical_not());
  const at::Tensor labels = torch::where(asked, tokens, torch::full_like(tokens, examples::kIgnore));
  PredictWorkload w;
  w.model = [config] { return examples::make_bert(config).layers; };
  w.x = {tokens, padding};
  w.y = {labels};
  w.loss = [](const Tensors& o, const Tensors& t) { return examples::mlm_loss(o[0], t[0]); };
  w.tied = examples::make_bert(config).tied;
  return w;
}

// Pairs of 10 to 25 words each side, vocabularies of 4,000.
PredictWorkload translator_workload(int64_t batch) {
  examples::TranslatorShape shape;
  shape.source_vocab = shape.target_vocab = 4000 + examples::kReservedIds;
  std::vector<examples::EncodedPair> pairs(static_cast<size_t>(batch));
  std::vector<int64_t> all;
  for (auto& p : pairs) {
    const auto words = [&] {
      const at::Tensor ids = torch::randint(examples::kReservedIds, shape.source_vocab, {torch::randint(10, 26, {1})
                                                                                            .item<int64_t>()});
      return std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
    };
    p.source = words();
    p.target = words();
    all.push_back(static_cast<int64_t>(all.size()));
  }
  const examples::TranslationBatch b = examples::make_batch(pairs, all);
  PredictWorkload w;
  w.model = [shape] { return examples::make_translator(shape).layers; };
  w.x = b.inputs;
  w.y = b.targets;
  w.loss = examples::translation_loss;
  w.tied = examples::make_translator(shape).tie;
  return w;
}

PredictWorkload workload(const std::string& model, int64_t batch) {
  if (model == "bert") return bert_workload(batch);
  if (model == "translator") return translator_workload(batch);
  const BenchData d = make_data(model, batch);
  PredictWorkload w;
  w.model = [model] { return make_model(model); };
  w.x = {d.x};
  w.y = {d.y};
  w.loss = [loss = d.loss](const Tensors& o, const Tensors& t) { return loss(o[0], t[0]); };
  return w;
}

struct PredictRow {
  std::string schedule;
  int k = 2, m = 4, chunks = 0, lookahead = 0;
};

std::vector<PredictRow> predict_rows() {
  std::vector<PredictRow> out;
  for (int m : {2, 4, 8}) out.push_back({"gpipe", 2, m});
  for (int m : {2, 4, 8}) out.push_back({"1f1b", 2, m});
  out.push_back({"eager-1f1b", 2, 8, 0, 1});
  for (int m : {4, 8}) out.push_back({"interleaved", 2, m, 2});
  for (int m : {4, 8}) out.push_back({"zb-h1", 2, m});
  out.push_back({"pipedream", 2, 4});
  for (int k : {3, 4}) {
    for (const char* s : {"gpipe", "1f1b", "zb-h1", "pipedream"}) out.push_back({s, k, 8});
    out.push_back({"interleaved", k, 2 * k, 2});  // rounds of one micro-batch per worker
  }
  return out;
}

}  // namespace

bool predict_table_knows(const std::string& model) {
  for (const char* m : {"lstm", "mlp", "resnet", "transformer", "bert", "translator"}) {
    if (model == m) return true;
  }
  return false;
}

int predict_table(const std::string& model, int64_t batch, int steps, int threads, int sharing) {
  if (!predict_table_knows(model)) return 2;
  struct Config {
    PredictRow row;
    std::unique_ptr<Pipeline> pipe;
    Prediction plan;
    std::vector<double> wall;
    std::vector<int64_t> stash;
  };
  torch::manual_seed(0);
  const PredictWorkload w = workload(model, batch);
  const OptimizerFactory sgd = [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(p, 1e-3);
  };
  torch::manual_seed(0);
  const auto reference = w.model();
  // PipeDream's step after each backward priced too; the workers share the CPU as measured.
  const auto options = ProfileOptions().sharing_stages(sharing).optimizer(sgd).count_cores(true);
  const auto profile = std::make_shared<ModelProfile>(
      profile_first_microbatch(reference, w.x, w.y, w.loss, PipelineOptions().microbatches(4), options));
  std::vector<Config> configs;
  for (const PredictRow& row : predict_rows()) {
    if (row.k * std::max(1, row.chunks) > static_cast<int>(reference->size())) continue;  // a stage needs a layer
    torch::manual_seed(0);
    auto layers = w.model();
    auto o = PipelineOptions()
                 .workers(row.k)
                 .microbatches(row.m)
                 .schedule(row.schedule)
                 .chunks(row.chunks)
                 .lookahead(row.lookahead)
                 .profile(profile)
                 .balance(Balance::kTime);
    if (row.schedule == "pipedream") {
      o.optimizer(sgd);
    } else if (!w.tied.empty()) {
      o.tied_parameters({w.tied});
    }
    Config c{row, nullptr, predict_step(layers, o, batch), {}, {}};
    c.pipe = std::make_unique<Pipeline>(layers, o);
    c.pipe->train_step(w.x, w.y, w.loss);  // warm-up
    configs.push_back(std::move(c));
  }
  for (int s = 0; s < steps; ++s) {
    for (auto& c : configs) {
      for (const auto& p : c.pipe->parameters()) p.mutable_grad() = at::Tensor();
      const StepResult r = c.pipe->train_step(w.x, w.y, w.loss);
      c.wall.push_back(r.wall_seconds);
      c.stash = r.peak_stash_bytes;
    }
  }
  std::printf("model %s, batch %lld, %d intra-op thread(s), median of %d steps taking turns; profile: %s\n\n",
              model.c_str(), static_cast<long long>(batch), threads, steps,
              profile->str().substr(0, profile->str().find('\n')).c_str());
  std::printf("| schedule | K | M | layers per stage | predicted ms | measured ms | error "
              "| predicted stash KiB (per stage) | measured | error |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  int within = 0;
  for (const auto& c : configs) {
    const double measured = median(c.wall), predicted = c.plan.step_seconds();
    std::string ps, ms;
    double worst = 0;
    for (size_t k = 0; k < c.stash.size(); ++k) {
      const int64_t p = c.plan.predicted[k].stash_bytes;
      ps += (k ? " / " : "") + std::to_string(p / 1024);
      ms += (k ? " / " : "") + std::to_string(c.stash[k] / 1024);
      if (c.stash[k] > 0) {
        worst = std::max(worst, std::abs(static_cast<double>(p - c.stash[k])) / static_cast<double>(c.stash[k]));
      }
    }
    const double error = predicted / measured - 1;
    within += std::abs(error) <= 0.1;
    std::string layers;
    for (const auto& stage : c.plan.split.stages) {
      layers += (layers.empty() ? "" : " ") + std::to_string(stage.begin) + "-" + std::to_string(stage.end - 1);
    }
    std::string name = c.row.schedule;
    if (c.row.chunks > 1) name += " v=" + std::to_string(c.row.chunks);
    if (c.row.lookahead > 0) name += " +" + std::to_string(c.row.lookahead);
    std::printf("| %s | %d | %d | %s | %.1f | %.1f | %+.1f%% | %s | %s | %.1f%% |\n", name.c_str(), c.row.k, c.row.m,
                layers.c_str(), predicted * 1e3, measured * 1e3, 100 * error, ps.c_str(), ms.c_str(),
                100 * worst);
  }
  std::printf("\n%d of %zu rows within 10 %%\n", within, configs.size());
  return 0;
}

}  // namespace conveyor::bench
