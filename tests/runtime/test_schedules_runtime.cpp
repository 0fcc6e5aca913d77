// The runtime under the schedules beyond the seeds: virtual stages (several
// chunks per worker), split backwards (I then W), recomputation and
// offloading declarations, and custom schedules in torch.distributed.pipelining's
// CSV form. Synchronous: every gradient equals the unsplit model's.
#include "schedules/generators.h"
#include "schedules/simulate.h"
#include "error_of.h"
#include "test_models.h"

#include <map>

namespace conveyor {
namespace {

using ::testing::HasSubstr;

// 12 layers: K = 4 workers of 2 chunks still get a layer or more per chunk.
torch::nn::Sequential make_deep_mlp() {
  torch::nn::Sequential m;
  int64_t width = 8;
  for (int i = 0; i < 6; ++i) {
    const int64_t next = i == 5 ? 3 : 12;
    m->push_back(torch::nn::Linear(width, next));
    if (i < 5) m->push_back(i % 2 ? torch::nn::AnyModule(torch::nn::Tanh()) : torch::nn::AnyModule(torch::nn::ReLU()));
    width = next;
  }
  m->push_back(torch::nn::Identity());
  m->to(torch::kFloat64);
  return m;
}

// The demo's language model with more LSTM layers: 8 layers.
torch::nn::Sequential make_deep_lstm_lm() {
  torch::nn::Sequential m(torch::nn::Embedding(testing::kVocab, 8));
  for (int i = 0; i < 6; ++i) {
    m->push_back(conveyor::FirstOutput<torch::nn::LSTM>(torch::nn::LSTMOptions(8, 8).batch_first(true)));
  }
  m->push_back(torch::nn::Linear(8, testing::kVocab));
  m->to(torch::kFloat64);
  return m;
}

struct Case {
  std::string schedule;
  int stages, microbatches;
  bool recompute = false, offload = false;
  int chunks = 0, lookahead = 0;
  std::string name() const {
    return schedule + (lookahead ? " +" + std::to_string(lookahead) : "") + " K=" + std::to_string(stages) +
           " M=" + std::to_string(microbatches) + (recompute ? " recompute" : "") + (offload ? " offload" : "");
  }
  PipelineOptions options() const {
    return PipelineOptions()
        .workers(stages)
        .microbatches(microbatches)
        .schedule(schedule)
        .chunks(chunks)
        .lookahead(lookahead)
        .recompute(recompute)
        .offload(offload)
        .channel_capacity(4);
  }
};

// One step under `c` and one unsplit backward on a clone: gradients and loss agree.
StepResult check_exact(torch::nn::Sequential model, const at::Tensor& input, const at::Tensor& target,
                       const LossFn& loss_fn, const Case& c) {
  auto reference = testing::clone_of(model);
  const at::Tensor ref_loss = loss_fn(reference->forward(input), target);
  ref_loss.backward();
  StageRunner pipe(model, c.options());
  const StepResult r = pipe.train_step(input, target, loss_fn);
  testing::expect_same_grads(pipe, reference, 1e-10, 0, c.name());
  EXPECT_NEAR(r.loss, ref_loss.item<double>(), 1e-10) << c.name();
  return r;
}

std::vector<Case> cases() {
  std::vector<Case> all;
  for (int k = 2; k <= 4; ++k) {
    for (bool recompute : {false, true}) {
      for (int m : {k, 2 * k}) {
        all.push_back({"interleaved", k, m, recompute});
        all.push_back({"zb-interleaved", k, m, recompute});
      }
      for (int m : {1, k - 1, k, 2 * k + 1}) all.push_back({"zb-h1", k, m, recompute});
    }
    all.push_back({"1f1b", k, 2 * k, true});
    all.push_back({"gpipe", k, k + 1, true});
    all.push_back({"zb-h1", k, 2 * k, false, true});
    all.push_back({"interleaved", k, 2 * k, false, true});
    for (int lookahead : {1, 2}) all.push_back({"eager-1f1b", k, 2 * k + 1, lookahead == 2, false, 0, lookahead});
    // The V shapes: worker w runs stages w and 2K-1-w; the turn at K-1 stays on a worker.
    for (bool recompute : {false, true}) {
      all.push_back({"zb-v", k, k, recompute});
      all.push_back({"zb-v", k, 2 * k + 1, recompute});
      all.push_back({"v-half", k, 2 * k, recompute});
      all.push_back({"v-min", k, 2 * k + 1, recompute});
      all.push_back({"dualpipev", k, 2 * k, recompute});
    }
    all.push_back({"zb-v", k, 2 * k, false, true});
    all.push_back({"dualpipev", k, 2 * k + 1, false, true});
  }
  return all;
}

TEST(NewSchedules, MlpGradientsAreExact) {
  for (const Case& c : cases()) {
    torch::manual_seed(c.stages * 100 + c.microbatches);
    const at::Tensor x = torch::randn({16, 8}, torch::kFloat64), y = torch::randn({16, 3}, torch::kFloat64);
    check_exact(make_deep_mlp(), x, y, testing::mse, c);
  }
}

TEST(NewSchedules, LstmLanguageModelGradientsAreExact) {
  std::vector<Case> some;  // the recurrent model is slower: fewer micro-batch counts
  for (const Case& c : cases()) {
    if (c.microbatches == c.stages || c.microbatches == 2 * c.stages + 1 || c.offload) some.push_back(c);
  }
  for (const Case& c : some) {
    torch::manual_seed(c.stages * 100 + c.microbatches);
    const at::Tensor x = torch::randint(testing::kVocab, {9, 4}), y = torch::randint(testing::kVocab, {9, 4});
    check_exact(make_deep_lstm_lm(), x, y, testing::lm_loss, c);
  }
}

// Three chunks per worker, and a stage whose layers share a weight (its W
// then differentiates the whole stage).
TEST(NewSchedules, MoreChunksAndSharedWeightsStayExact) {
  torch::manual_seed(3);
  const at::Tensor x = torch::randn({12, 8}, torch::kFloat64), y = torch::randn({12, 3}, torch::kFloat64);
  check_exact(make_deep_mlp(), x, y, testing::mse, Case{"interleaved", 2, 4, false, false, 3});
  check_exact(make_deep_mlp(), x, y, testing::mse, Case{"zb-interleaved", 2, 2, true, false, 3});
  torch::nn::Linear shared(8, 8);
  torch::nn::Sequential m(shared, torch::nn::Tanh(), shared, torch::nn::Linear(8, 3));
  m->to(torch::kFloat64);
  // (A clone would give the two uses two copies: the reference is the model itself.)
  testing::mse(m->forward(x), y).backward();
  std::map<std::string, at::Tensor> expected;
  for (const auto& p : m->named_parameters()) expected[p.key()] = p.value().grad().clone();
  m->zero_grad();
  StageRunner pipe(m, PipelineOptions().workers(2).microbatches(3).schedule("zb-h1").boundaries({3}));
  EXPECT_TRUE(pipe.stage(0).shares_parameters_across_layers());
  pipe.train_step(x, y, testing::mse);
  for (const auto& [name, p] : pipe.named_parameters()) {  // the shared layer's weights are listed once
    EXPECT_TRUE(p.grad().allclose(expected.at(name), 0, 1e-10))
        << name << " differs by " << (p.grad() - expected.at(name)).abs().max().item<double>();
  }
}

TEST(NewSchedules, CountsFollowTheSchedule) {
  for (const Case& c : {Case{"interleaved", 2, 4}, Case{"zb-h1", 3, 6}, Case{"zb-interleaved", 2, 4},
                        Case{"interleaved", 2, 4, true}, Case{"zb-h1", 3, 6, true},
                        Case{"eager-1f1b", 3, 8, false, false, 0, 2}, Case{"eager-1f1b", 2, 12, false, false, 0, 6}}) {
    torch::manual_seed(1);
    StageRunner pipe(make_deep_mlp(), c.options());
    const at::Tensor x = torch::randn({16, 8}, torch::kFloat64), y = torch::randn({16, 3}, torch::kFloat64);
    const StepResult r = pipe.train_step(x, y, testing::mse);
    const schedules::Schedule& s = pipe.schedule();
    const auto sim = schedules::simulate(s, schedules::StageCosts::uniform(s.num_stages, 1, 2));
    EXPECT_EQ(r.peak_inflight, sim.peak_inflight) << c.name();
    for (int k = 0; k < s.num_stages; ++k) {
      EXPECT_EQ(r.trace[k].size(), schedules::stage_actions(s, k).size()) << c.name() << " stage " << k;
      EXPECT_EQ(c.recompute ? r.peak_stashed_activations[k] : r.peak_stashed_inputs[k], 0) << c.name();
      EXPECT_EQ(c.recompute ? r.peak_stashed_inputs[k] : r.peak_stashed_activations[k], sim.peak_inflight[k]);
    }
    EXPECT_EQ(pipe.num_workers(), c.stages);
    EXPECT_EQ(pipe.num_stages(), s.num_stages);
  }
}

// Recomputation replays random layers with the stage's own streams: the
// gradients are those of the run that kept its graphs, bit for bit.
TEST(NewSchedules, RecomputationReplaysDropout) {
  const auto run = [](bool recompute) {
    torch::manual_seed(7);
    torch::nn::Sequential m(torch::nn::Linear(8, 16), torch::nn::Dropout(0.5), torch::nn::Tanh(),
                            torch::nn::Linear(16, 16), torch::nn::Dropout(0.3), torch::nn::Linear(16, 3));
    m->to(torch::kFloat64);
    StageRunner pipe(m,
                  PipelineOptions().workers(2).microbatches(4).schedule("zb-h1").stage_rng(true).recompute(recompute));
    const at::Tensor x = torch::randn({8, 8}, torch::kFloat64), y = torch::randn({8, 3}, torch::kFloat64);
    pipe.train_step(x, y, testing::mse);
    std::vector<at::Tensor> grads;
    for (const auto& p : pipe.parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  const auto kept = run(false), replayed = run(true);
  ASSERT_EQ(kept.size(), replayed.size());
  for (size_t i = 0; i < kept.size(); ++i) EXPECT_TRUE(kept[i].equal(replayed[i])) << "parameter " << i;
}

// A replayed forward (recomputation, offloading) leaves batch norm's running
// statistics as the first forward left them: each micro-batch counts once, as
// without replay, and the gradients are the same.
TEST(NewSchedules, RecomputationCountsEachMicrobatchOnceInBatchNormStatistics) {
  const auto run = [](bool recompute, bool offload) {
    torch::manual_seed(3);
    torch::nn::Sequential m(torch::nn::Linear(8, 16), torch::nn::BatchNorm1d(16), torch::nn::Tanh(),
                            torch::nn::Linear(16, 16), torch::nn::BatchNorm1d(16), torch::nn::Linear(16, 3));
    m->to(torch::kFloat64);
    StageRunner pipe(m, PipelineOptions().workers(2).microbatches(4).schedule("1f1b").recompute(recompute).offload(
                         offload));
    const at::Tensor x = torch::randn({16, 8}, torch::kFloat64), y = torch::randn({16, 3}, torch::kFloat64);
    std::vector<at::Tensor> out;
    for (int step = 0; step < 2; ++step) pipe.train_step(x, y, testing::mse);
    for (const auto& p : pipe.parameters()) out.push_back(p.grad().clone());
    for (const auto& b : m->buffers()) out.push_back(b.clone());
    EXPECT_EQ(m[1]->named_buffers()["num_batches_tracked"].item<int64_t>(), 8) << "2 steps of 4 micro-batches";
    return out;
  };
  const auto kept = run(false, false);
  for (const bool offload : {false, true}) {
    const auto replayed = run(true, offload);
    ASSERT_EQ(kept.size(), replayed.size());
    for (size_t i = 0; i < kept.size(); ++i) {
      EXPECT_TRUE(kept[i].equal(replayed[i])) << (offload ? "offload" : "recompute") << ": tensor " << i;
    }
  }
}

// A user's schedule: torch.distributed.pipelining's CSV of a V placement
// (worker 0 runs pieces 0 and 3, worker 1 pieces 1 and 2), split backwards.
TEST(NewSchedules, ACustomVShapedCsvScheduleRuns) {
  const std::string csv =
      "0F0,0F1,3F0,3I0,3F1,3I1,0I0,3W0,0I1,3W1,0W0,0W1\n"
      "1F0,2F0,1F1,2F1,2I0,1I0,2I1,1I1,2W0,1W0,2W1,1W1\n";
  torch::manual_seed(5);
  auto model = make_deep_mlp();
  auto reference = testing::clone_of(model);
  const at::Tensor x = torch::randn({6, 8}, torch::kFloat64), y = torch::randn({6, 3}, torch::kFloat64);
  testing::mse(reference->forward(x), y).backward();
  StageRunner pipe(model, PipelineOptions().microbatches(2).schedule_text(csv));
  EXPECT_EQ(pipe.num_workers(), 2);
  EXPECT_EQ(pipe.num_stages(), 4);
  EXPECT_EQ(pipe.schedule().placement, (std::vector<int>{0, 1, 1, 0}));
  pipe.train_step(x, y, testing::mse);
  testing::expect_same_grads(pipe, reference, 1e-10, 0, "custom V");
  // Inference runs the same placement.
  EXPECT_TRUE(pipe.forward(x).allclose(reference->forward(x), 1e-12, 1e-12));
}

TEST(NewSchedules, BadRequestsAreClear) {
  const auto error = [](const PipelineOptions& o) {
    return testing::error_of([&] { StageRunner(make_deep_mlp(), o); });
  };
  EXPECT_THAT(error(PipelineOptions().workers(2).microbatches(3).schedule("interleaved")),
              HasSubstr("3 micro-batches do not fill rounds of 2 (use a multiple of 2)"));
  EXPECT_THAT(error(PipelineOptions().workers(4).microbatches(4).schedule("interleaved").chunks(4)),
              HasSubstr("16 stages asked for a model of only 12 layers"));
  EXPECT_THAT(error(PipelineOptions().workers(2).microbatches(4).schedule("1f1b").chunks(2)),
              HasSubstr("schedule '1f1b' runs one stage per worker, not 2 chunks"));
  EXPECT_THAT(error(PipelineOptions().workers(5).microbatches(10).schedule("zb-interleaved")),
              HasSubstr("deadlocks under blocking transfers with channel capacity 2"));
  EXPECT_THAT(error(PipelineOptions().workers(5).microbatches(10).schedule("zb-interleaved")),
              HasSubstr("(it runs with channel_capacity(3))"));
  EXPECT_THAT(error(PipelineOptions().workers(2).microbatches(4).schedule("pipedream").recompute(true).optimizer(
                  [](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, 0.1); })),
              HasSubstr("recompute applies to synchronous schedules"));
  EXPECT_THAT(error(PipelineOptions().workers(3).microbatches(2).schedule_text("0F0 1F0 1B0 0B0\n0F1\n")),
              HasSubstr("the schedule is for 2 workers"));
  // Of the sharding actions a pipeline runs one REDUCE_GRAD per stage and step (more only with
  // shard "gradients", across processes).
  EXPECT_THAT(error(PipelineOptions().microbatches(1).schedule_text("0UNSHARD 0F0 0B0 0RESHARD\n1F0 1B0\n")),
              HasSubstr("schedule 'custom' has 0UNSHARD on worker 0, which a pipeline does not run: its stages' "
                        "parameters stay whole on every replica"));
  EXPECT_THAT(error(PipelineOptions().microbatches(2).schedule_text(
                  "0F0 0F1 0B0 0REDUCE_GRAD 0B1 0REDUCE_GRAD\n1F0 1B0 1F1 1B1\n")),
              HasSubstr("has 0REDUCE_GRAD on worker 0, which a pipeline does not run: it reduces a stage's gradients "
                        "once a step, after the stage's last backward"));
  EXPECT_THAT(error(PipelineOptions().microbatches(1).schedule_text("0F0 0REDUCE_GRAD 0B0\n1F0 1B0\n")),
              HasSubstr("0REDUCE_GRAD"));
}

// A schedule that places its stages' gradient reductions runs as without
// them in one process: there are no replicas to reduce across.
TEST(NewSchedules, GradientReductionsWithoutReplicasChangeNothing) {
  torch::manual_seed(5);
  auto model = make_deep_mlp();
  auto reference = testing::clone_of(model);
  const at::Tensor x = torch::randn({6, 8}, torch::kFloat64), y = torch::randn({6, 3}, torch::kFloat64);
  testing::mse(reference->forward(x), y).backward();
  StageRunner pipe(model, PipelineOptions().microbatches(2).schedule_text(
                              "0F0 0F1 0B0 0B1 0REDUCE_GRAD\n1F0 1B0 1F1 1B1 1REDUCE_GRAD\n"));
  EXPECT_TRUE(pipe.schedule().has_sharding());
  pipe.train_step(x, y, testing::mse);
  testing::expect_same_grads(pipe, reference, 1e-10, 0, "with REDUCE_GRAD");
}

}  // namespace
}  // namespace conveyor
