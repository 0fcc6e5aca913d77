#include "examples/translator/translator_app.h"

#include "examples/common/training_flags.h"

#include "examples/common/flags.h"
#include "examples/common/progress.h"
#include "examples/translator/translator_bleu.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <stdexcept>

namespace conveyor::examples {

namespace {

constexpr uint64_t kSplitSeed = 14;  // fixed: every run trains and tests on the same pairs

std::vector<SentencePair> read_pairs(const TranslatorConfig& c, std::string& description) {
  if (!c.source_file.empty() || !c.target_file.empty()) {
    if (c.source_file.empty() || c.target_file.empty()) {
      throw std::runtime_error("--source-file and --target-file go together: give both or neither");
    }
    description = "parallel files " + c.source_file + " / " + c.target_file;
    return read_parallel_files(c.source_file, c.target_file);
  }
  const auto source = read_sword_module(c.source_module, c.cache_dir);
  const auto target = read_sword_module(c.target_module, c.cache_dir);
  description = "SWORD modules " + c.source_module + " (" + std::to_string(source.size()) + " verses) and " +
                c.target_module + " (" + std::to_string(target.size()) + " verses), aligned by reference; cache " +
                c.cache_dir;
  return align_by_reference(source, target);
}

int64_t unknown_share_permille(const std::vector<EncodedPair>& pairs) {
  int64_t unknown = 0, total = 0;
  for (const auto& p : pairs) {
    for (const int64_t id : p.target) unknown += id == kUnkId;
    total += static_cast<int64_t>(p.target.size());
  }
  return total ? 1000 * unknown / total : 0;
}

}  // namespace

LoadedCorpus load_corpus(const TranslatorConfig& c, bool verbose) {
  std::string description;
  std::vector<SentencePair> pairs;
  TranslationDataOptions options;
  options.max_tokens = c.max_tokens;
  options.source_vocab = options.target_vocab = c.vocab;
  options.max_train_pairs = c.train_pairs;
  options.split_seed = kSplitSeed;
  LoadedCorpus corpus;
  try {
    pairs = read_pairs(c, description);
    corpus = {prepare_translation_data(pairs, options), bucket_bounds(c.bucket_width, c.max_tokens)};
  } catch (const std::exception& e) {
    throw DataError(e.what());
  }
  const TranslationData& d = corpus.data;
  if (verbose) {
    std::cout << "data: " << description << "\n  " << format_count(double(pairs.size())) << " pairs, "
              << format_count(double(d.too_long)) << " left out for a side over " << c.max_tokens
              << " tokens; split by a hash of the reference: train " << d.pairs[0].size() << ", valid "
              << d.pairs[1].size() << ", test " << d.pairs[2].size() << "\n  vocabularies (train split): source "
              << d.source_vocab.size() << ", target " << d.target_vocab.size() << " words; <unk> is "
              << fixed(unknown_share_permille(d.encoded[1]) / 10.0, 1)
              << "% of valid target words\n  buckets by length:";
    for (const int64_t b : corpus.bounds) std::cout << " " << b;
    std::cout << " tokens\n";
  }
  return corpus;
}

TrainBatches::TrainBatches(const LoadedCorpus& corpus, int64_t batch, int64_t min_batch, uint64_t seed)
    : corpus_(corpus), batch_(batch), min_batch_(min_batch), seed_(seed) {
  batches_ = bucket_batches(corpus_.data.encoded[0], corpus_.bounds, batch_, min_batch_, true, seed_);
  if (batches_.empty()) {
    throw std::invalid_argument("no bucket of the train split holds " + std::to_string(min_batch_) +
                                " pairs (one per micro-batch): lower --microbatches or give more data");
  }
}

const std::vector<int64_t>& TrainBatches::next() {
  if (position_ == batches_.size()) {
    ++epoch_;
    position_ = 0;
    batches_ = bucket_batches(corpus_.data.encoded[0], corpus_.bounds, batch_, min_batch_, true,
                              seed_ + static_cast<uint64_t>(epoch_) * 7919);
  }
  return batches_[position_++];
}

TranslatorShape translator_shape(const TranslatorConfig& c, const TranslationData& data) {
  TranslatorShape s;
  s.source_vocab = data.source_vocab.size() + kReservedIds;
  s.target_vocab = data.target_vocab.size() + kReservedIds;
  s.embed = c.embed;
  s.hidden = c.hidden;
  s.dropout = c.dropout;
  return s;
}

PipelineOptions pipeline_options(const TranslatorConfig& c, const Translator& model, bool own_optimizer) {
  const int stages = static_cast<int>(c.stages), microbatches = static_cast<int>(c.microbatches);
  const bool synchronous = schedules::make_schedule(c.schedule, stages, microbatches).synchronous();
  auto options = PipelineOptions()
                     .workers(stages)
                     .microbatches(microbatches)
                     .schedule(c.schedule)
                     .boundaries(balanced_boundaries(model.costs, stages));
  if (c.tie) {
    if (!synchronous) {
      throw std::invalid_argument("--tie on needs a synchronous schedule (sequential, gpipe, 1f1b): under " +
                                  c.schedule +
                                  " each stage would step its copy of the tied weight with its own gradient");
    }
    options.tied_parameters({model.tie});
  }
  if (own_optimizer || !synchronous) {
    options.optimizer([lr = c.lr](std::vector<at::Tensor> p) {
      return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(lr));
    });
    if (c.clip > 0) options.clip_grad_norm(c.clip);
  }
  options.autocast(autocast_dtype("--autocast", c.autocast));
  return options;
}

int64_t tail_steps(int64_t steps) { return std::clamp<int64_t>(steps / 10, 1, 50); }

double mean_loss(torch::nn::Sequential layers, const std::vector<EncodedPair>& pairs,
                 const std::vector<int64_t>& bounds, int64_t batch) {
  torch::NoGradGuard no_grad;
  layers->eval();
  double total = 0;
  int64_t tokens = 0;
  for (const auto& indices : bucket_batches(pairs, bounds, batch, 1, false, 0)) {
    const TranslationBatch b = make_batch(pairs, indices);
    const Tensors out = forward_layers(layers, 0, layers->size(), b.inputs);
    total += translation_loss(out, b.targets).item<double>() * static_cast<double>(b.target_tokens);
    tokens += b.target_tokens;
  }
  layers->train();
  return total / static_cast<double>(tokens);
}

std::pair<double, double> evaluate_bleu(const TranslatorConfig& c, const LoadedCorpus& corpus,
                                        torch::nn::Sequential layers) {
  const TranslationData& d = corpus.data;
  const std::vector<EncodedPair>& test = d.encoded[2];
  const size_t count = c.test_pairs > 0 ? std::min(test.size(), static_cast<size_t>(c.test_pairs)) : test.size();
  const std::vector<EncodedPair> chosen(test.begin(), test.begin() + static_cast<std::ptrdiff_t>(count));
  std::vector<std::string> hypotheses(count), references, sources;
  layers->eval();
  for (const auto& indices : bucket_batches(chosen, corpus.bounds, c.batch, 1, false, 0)) {
    const auto ids = greedy_translate(layers, chosen, indices, c.max_tokens + 5);
    for (size_t i = 0; i < indices.size(); ++i) {
      hypotheses[static_cast<size_t>(indices[i])] = detokenize(decode_ids(d.target_vocab, ids[i]));
    }
  }
  layers->train();
  for (size_t i = 0; i < count; ++i) {
    references.push_back(d.pairs[2][i].target);
    sources.push_back(d.pairs[2][i].source);
  }
  std::filesystem::create_directories(c.out_dir);
  const std::string dir = c.out_dir + "/";
  const std::string hyp = dir + "test.hyp.es", ref = dir + "test.ref.es", src = dir + "test.src.en";
  write_lines(hyp, hypotheses);
  write_lines(ref, references);
  write_lines(src, sources);
  std::cout << "samples (test split, greedy decoding):\n";
  for (size_t i = 0; i < std::min(count, static_cast<size_t>(c.samples)); ++i) {
    std::cout << "  " << d.pairs[2][i].reference << "\n    source:    " << sources[i]
              << "\n    reference: " << references[i] << "\n    model:     " << hypotheses[i] << "\n";
  }
  const double model = sacrebleu(c.python, ref, hyp), copy = sacrebleu(c.python, ref, src);
  std::cout << "BLEU (sacrebleu, lower-cased, 13a) on " << count << " test pairs: model " << fixed(model, 2)
            << ", copy-the-source baseline " << fixed(copy, 2) << "\n  files: " << hyp << ", " << ref << ", " << src
            << "\n";
  return {model, copy};
}

int verdict(const TranslatorConfig& c, double start_loss, double end_loss, const std::pair<double, double>* bleu) {
  const bool fell = end_loss <= (1.0 - c.require_drop) * start_loss;
  const bool beat = !bleu || !c.require_bleu || bleu->first > bleu->second;
  std::cout << (fell && beat ? "PASS" : "FAIL") << ": the training loss went from " << fixed(start_loss, 3) << " to "
            << fixed(end_loss, 3) << " (required: at most " << fixed((1.0 - c.require_drop) * start_loss, 3) << ")";
  if (bleu) {
    const bool above = bleu->first > bleu->second;
    std::cout << "; BLEU " << fixed(bleu->first, 2) << (above ? " beats" : " does not beat") << " the copy baseline's "
              << fixed(bleu->second, 2) << (c.require_bleu ? "" : " (not required)");
  }
  std::cout << (fell && beat ? "" : "; train longer (--steps)") << "\n";
  return fell && beat ? 0 : 1;
}

}  // namespace conveyor::examples
