#include "examples/bert/bert_data.h"

#include <torch/torch.h>

#include <algorithm>
#include <random>
#include <stdexcept>

namespace conveyor::examples {

namespace {

// The sequences of one fortune: its pieces in chunks of seq_len - 2, each
// between [CLS] and [SEP].
void append_sequences(Sequences& to, const std::vector<int64_t>& pieces, const SubwordTokenizer& t, int64_t seq_len) {
  const auto n = static_cast<int64_t>(pieces.size());
  for (int64_t begin = 0; begin < n; begin += seq_len - 2) {
    std::vector<int64_t> seq = {t.cls_id()};
    seq.insert(seq.end(), pieces.begin() + begin, pieces.begin() + std::min(n, begin + seq_len - 2));
    seq.push_back(t.sep_id());
    to.push_back(std::move(seq));
  }
}

// Positions [begin, end) of the units masking chooses from: whole words, or single pieces.
std::vector<std::pair<int64_t, int64_t>> units(const std::vector<int64_t>& seq, const SubwordTokenizer& t,
                                               bool whole_word) {
  std::vector<std::pair<int64_t, int64_t>> out;
  const auto last = static_cast<int64_t>(seq.size()) - 1;  // [SEP]
  for (int64_t i = 1; i < last; ++i) {
    if (!whole_word || out.empty() || t.starts_word(seq[i])) {
      out.emplace_back(i, i + 1);
    } else {
      out.back().second = i + 1;
    }
  }
  return out;
}

}  // namespace

MlmData load_mlm_data(const MlmDataOptions& o) {
  if (o.seq_len < 3) {
    throw std::invalid_argument("a sequence of " + std::to_string(o.seq_len) +
                                " pieces has no room for a piece between [CLS] and [SEP] (at least 3)");
  }
  FortuneEntries read = read_fortunes(o.fortune_dir);
  std::vector<std::string> split_texts[3];
  for (auto& entry : read.entries) split_texts[static_cast<int>(split_of(entry, o.split_seed))].push_back(entry);
  MlmData d;
  d.source = read.source;
  const std::string model = o.tokenizer_model.empty()
                                ? SubwordTokenizer::train_cached(split_texts[0], o.vocab, o.tokenizer_dir,
                                                                 &d.trained_tokenizer)
                                : o.tokenizer_model;
  d.tokenizer = SubwordTokenizer::load(model);
  Sequences* splits[3] = {&d.train, &d.valid, &d.test};
  std::vector<int64_t> flat[2];  // pieces of train and valid, for the unigram baseline
  for (int s = 0; s < 3; ++s) {
    for (const auto& text : split_texts[s]) {
      const auto pieces = d.tokenizer.encode(text);
      if (pieces.empty()) continue;
      if (s < 2) flat[s].insert(flat[s].end(), pieces.begin(), pieces.end());
      append_sequences(*splits[s], pieces, d.tokenizer, o.seq_len);
    }
    if (splits[s]->empty()) throw std::runtime_error("a split of the fortunes in " + o.fortune_dir + " is empty");
  }
  d.train_pieces = static_cast<int64_t>(flat[0].size());
  d.valid_pieces = static_cast<int64_t>(flat[1].size());
  d.valid_unigram = unigram_baseline(flat[0], flat[1], d.tokenizer.size());
  return d;
}

MlmBatch make_mlm_batch(const Sequences& seqs, const std::vector<int64_t>& which, const SubwordTokenizer& t,
                        const Masking& masking, uint64_t seed) {
  int64_t len = 0;
  for (int64_t i : which) len = std::max<int64_t>(len, static_cast<int64_t>(seqs.at(i).size()));
  const auto n = static_cast<int64_t>(which.size());
  std::vector<int64_t> tokens(n * len, t.pad_id()), labels(n * len, kIgnore);
  std::vector<uint8_t> padding(n * len, 1);
  MlmBatch batch;
  for (int64_t row = 0; row < n; ++row) {
    const auto& seq = seqs[which[row]];
    std::mt19937_64 rng(stable_hash(std::to_string(which[row]), seed));
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    const auto choices = units(seq, t, masking.whole_word);
    std::vector<bool> chosen(choices.size());
    for (size_t u = 0; u < choices.size(); ++u) chosen[u] = uniform(rng) < masking.probability;
    if (!choices.empty() && std::none_of(chosen.begin(), chosen.end(), [](bool b) { return b; })) {
      chosen[std::uniform_int_distribution<size_t>(0, choices.size() - 1)(rng)] = true;
    }
    int64_t* out = tokens.data() + row * len;
    std::copy(seq.begin(), seq.end(), out);
    std::fill_n(padding.begin() + row * len, seq.size(), 0);
    for (size_t u = 0; u < choices.size(); ++u) {
      if (!chosen[u]) continue;
      for (int64_t i = choices[u].first; i < choices[u].second; ++i) {
        labels[row * len + i] = seq[i];
        ++batch.predictions;
        const double r = uniform(rng);
        if (r < 0.8) {
          out[i] = t.mask_id();
        } else if (r < 0.9) {
          int64_t id = -1;
          while (!t.is_ordinary(id)) id = std::uniform_int_distribution<int64_t>(0, t.size() - 1)(rng);
          out[i] = id;
        }
      }
    }
  }
  batch.tokens = torch::tensor(tokens, torch::kLong).view({n, len});
  batch.labels = torch::tensor(labels, torch::kLong).view({n, len});
  batch.padding = torch::tensor(std::vector<int64_t>(padding.begin(), padding.end()), torch::kLong).view({n, len}).to(
      torch::kBool);
  return batch;
}

}  // namespace conveyor::examples
