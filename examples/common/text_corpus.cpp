#include "examples/common/text_corpus.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace conveyor::examples {

namespace fs = std::filesystem;

namespace {

bool is_word_byte(unsigned char c) { return std::isalnum(c) || c >= 0x80; }

void append(std::vector<std::string>& to, std::vector<std::string> tokens) {
  to.insert(to.end(), std::make_move_iterator(tokens.begin()), std::make_move_iterator(tokens.end()));
}

int64_t count_distinct(const std::vector<std::string>& tokens) {
  std::unordered_map<std::string_view, int> seen;
  for (const auto& t : tokens) seen.emplace(t, 0);
  return static_cast<int64_t>(seen.size());
}

void check_split_not_empty(const std::vector<int64_t>& ids, const char* split, const std::string& where) {
  if (ids.empty()) throw std::runtime_error(std::string("the ") + split + " split of " + where + " is empty");
}

}  // namespace

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open '" + path + "' for reading");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw std::runtime_error("error while reading '" + path + "'");
  return text.str();
}

std::vector<std::string> tokenize(std::string_view text) {
  std::vector<std::string> tokens;
  std::string word;
  auto flush = [&] {
    if (!word.empty()) tokens.push_back(std::move(word));
    word.clear();
  };
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (is_word_byte(c)) {
      word.push_back(static_cast<char>(std::tolower(c)));
      ++i;
    } else if (c == '\'' && !word.empty() && i + 1 < text.size() &&
               is_word_byte(static_cast<unsigned char>(text[i + 1]))) {
      word.push_back('\'');  // inside a word: "don't", "o'clock"
      ++i;
    } else if (std::isgraph(c)) {
      flush();
      size_t end = i;
      while (end < text.size() && text[end] == text[i]) ++end;
      tokens.emplace_back(text.substr(i, end - i));
      i = end;
    } else {  // white space and control characters separate tokens
      flush();
      ++i;
    }
  }
  flush();
  return tokens;
}

std::vector<std::string> split_fortunes(std::string_view file_text) {
  std::vector<std::string> entries;
  std::string entry;
  auto close_entry = [&] {
    if (std::any_of(entry.begin(), entry.end(), [](unsigned char c) { return std::isgraph(c) || c >= 0x80; })) {
      entries.push_back(std::move(entry));
    }
    entry.clear();
  };
  size_t pos = 0;
  while (pos < file_text.size()) {
    size_t end = file_text.find('\n', pos);
    if (end == std::string_view::npos) end = file_text.size();
    std::string_view line = file_text.substr(pos, end - pos);
    pos = end + 1;
    std::string_view trimmed = line;
    while (!trimmed.empty() && (trimmed.back() == '\r' || trimmed.back() == ' ' || trimmed.back() == '\t')) {
      trimmed.remove_suffix(1);
    }
    if (trimmed == "%") {
      close_entry();
    } else {
      entry.append(line);
      entry.push_back('\n');
    }
  }
  close_entry();
  return entries;
}

Vocabulary Vocabulary::build(const std::vector<std::string>& tokens, int64_t max_size) {
  if (max_size < 2) {
    throw std::invalid_argument("vocabulary size must be at least 2 (" + std::string(kUnk) + " and one word), got " +
                                std::to_string(max_size));
  }
  std::unordered_map<std::string_view, int64_t> counts;
  for (const auto& t : tokens) {
    if (t != kUnk) ++counts[t];
  }
  std::vector<std::pair<std::string_view, int64_t>> ranked(counts.begin(), counts.end());
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  if (static_cast<int64_t>(ranked.size()) > max_size - 1) ranked.resize(max_size - 1);

  Vocabulary vocab;
  vocab.words_.emplace_back(kUnk);
  for (const auto& [word, count] : ranked) vocab.words_.emplace_back(word);
  for (size_t i = 0; i < vocab.words_.size(); ++i) vocab.ids_.emplace(vocab.words_[i], static_cast<int64_t>(i));
  return vocab;
}

int64_t Vocabulary::id(const std::string& word) const {
  auto it = ids_.find(word);
  return it == ids_.end() ? 0 : it->second;
}

const std::string& Vocabulary::word(int64_t id) const {
  if (id < 0 || id >= size()) {
    throw std::out_of_range("word id " + std::to_string(id) + " is outside the vocabulary [0, " +
                            std::to_string(size()) + ")");
  }
  return words_[id];
}

std::vector<int64_t> Vocabulary::encode(const std::vector<std::string>& tokens) const {
  std::vector<int64_t> ids;
  ids.reserve(tokens.size());
  for (const auto& t : tokens) ids.push_back(id(t));
  return ids;
}

// 64-bit FNV-1a followed by the SplitMix64 finaliser: stable across
// platforms and standard libraries, unlike std::hash.
uint64_t stable_hash(std::string_view text, uint64_t seed) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (int i = 0; i < 8; ++i) h = (h ^ ((seed >> (8 * i)) & 0xff)) * 0x100000001b3ULL;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ULL;
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  return h ^ (h >> 31);
}

Split split_of(std::string_view entry, uint64_t seed) {
  const uint64_t bucket = stable_hash(entry, seed) % 100;
  return bucket < 90 ? Split::kTrain : bucket < 95 ? Split::kValid : Split::kTest;
}

FortuneEntries read_fortunes(const std::string& dir) {
  std::error_code error;
  if (!fs::is_directory(dir, error)) {
    throw std::runtime_error("the fortune directory '" + dir + "' does not exist or is not a directory");
  }
  std::vector<fs::path> files;
  for (const auto& item : fs::directory_iterator(dir)) {
    const std::string ext = item.path().extension().string();
    if (ext == ".dat" || ext == ".u8" || !item.is_regular_file()) continue;
    files.push_back(item.path());
  }
  if (files.empty()) throw std::runtime_error("the fortune directory '" + dir + "' holds no fortune file");
  std::sort(files.begin(), files.end());
  FortuneEntries read;
  read.source = std::to_string(files.size()) + " fortune files in " + dir;
  for (const auto& file : files) {
    for (auto& entry : split_fortunes(read_text_file(file.string()))) read.entries.push_back(std::move(entry));
  }
  return read;
}

Corpus load_fortunes(const std::string& dir, int64_t max_vocab, uint64_t seed) {
  FortuneEntries read = read_fortunes(dir);
  Corpus corpus;
  std::vector<std::string> tokens[3];
  int64_t* entry_counts[3] = {&corpus.train_entries, &corpus.valid_entries, &corpus.test_entries};
  for (const auto& entry : read.entries) {
    const int s = static_cast<int>(split_of(entry, seed));
    append(tokens[s], tokenize(entry));
    tokens[s].emplace_back(kEos);
    ++*entry_counts[s];
  }
  corpus.source = std::move(read.source);
  corpus.distinct_train_words = count_distinct(tokens[0]);
  corpus.vocab = Vocabulary::build(tokens[0], max_vocab);
  corpus.train = corpus.vocab.encode(tokens[0]);
  corpus.valid = corpus.vocab.encode(tokens[1]);
  corpus.test = corpus.vocab.encode(tokens[2]);
  check_split_not_empty(corpus.train, "train", dir);
  check_split_not_empty(corpus.valid, "valid", dir);
  check_split_not_empty(corpus.test, "test", dir);
  return corpus;
}

Corpus load_ptb(const std::string& dir, int64_t max_vocab) {
  std::error_code error;
  if (!fs::is_directory(dir, error)) {
    throw std::runtime_error("the PTB data directory '" + dir + "' does not exist or is not a directory");
  }
  const char* names[3] = {"ptb.train.txt", "ptb.valid.txt", "ptb.test.txt"};
  std::vector<std::string> tokens[3];
  int64_t lines[3] = {0, 0, 0};
  for (int s = 0; s < 3; ++s) {
    const fs::path path = fs::path(dir) / names[s];
    if (!fs::exists(path, error)) throw std::runtime_error("'" + path.string() + "' is missing");
    const std::string text = read_text_file(path.string());
    if (text.empty()) throw std::runtime_error("'" + path.string() + "' is empty");
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream words(line);
      std::string w;
      bool any = false;
      while (words >> w) {
        tokens[s].push_back(w);
        any = true;
      }
      if (any) {
        tokens[s].emplace_back(kEos);
        ++lines[s];
      }
    }
    if (tokens[s].empty()) throw std::runtime_error("'" + path.string() + "' holds no words");
  }
  Corpus corpus;
  corpus.source = "PTB-format files in " + dir;
  corpus.distinct_train_words = count_distinct(tokens[0]);
  corpus.vocab = Vocabulary::build(tokens[0], max_vocab);
  corpus.train = corpus.vocab.encode(tokens[0]);
  corpus.valid = corpus.vocab.encode(tokens[1]);
  corpus.test = corpus.vocab.encode(tokens[2]);
  corpus.train_entries = lines[0];
  corpus.valid_entries = lines[1];
  corpus.test_entries = lines[2];
  return corpus;
}

int64_t TokenGrid::num_windows(int64_t bptt) const {
  if (bptt < 1) throw std::invalid_argument("bptt must be at least 1, got " + std::to_string(bptt));
  return cols < 2 ? 0 : (cols - 1 + bptt - 1) / bptt;
}

TokenGrid::Window TokenGrid::window(int64_t index, int64_t bptt) const {
  const int64_t n = num_windows(bptt);
  if (index < 0 || index >= n) {
    throw std::out_of_range("window " + std::to_string(index) + " is outside [0, " + std::to_string(n) + ") for bptt " +
                            std::to_string(bptt));
  }
  Window w;
  const int64_t start = index * bptt;
  w.len = std::min(bptt, cols - 1 - start);
  w.inputs.reserve(rows * w.len);
  w.targets.reserve(rows * w.len);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t* row = ids.data() + r * cols + start;
    w.inputs.insert(w.inputs.end(), row, row + w.len);
    w.targets.insert(w.targets.end(), row + 1, row + 1 + w.len);
  }
  return w;
}

TokenGrid batchify(const std::vector<int64_t>& stream, int64_t rows, const std::string& what) {
  if (rows < 1) throw std::invalid_argument("batch (rows) must be at least 1, got " + std::to_string(rows));
  const int64_t cols = static_cast<int64_t>(stream.size()) / rows;
  if (cols < 2) {
    throw std::invalid_argument("the " + what + " split has " + std::to_string(stream.size()) +
                                " tokens, too few for " + std::to_string(rows) +
                                " rows of at least 2 tokens: use a smaller batch");
  }
  TokenGrid grid;
  grid.rows = rows;
  grid.cols = cols;
  grid.ids.assign(stream.begin(), stream.begin() + rows * cols);
  return grid;
}

double UnigramBaseline::perplexity() const { return std::exp(cross_entropy); }

UnigramBaseline unigram_baseline(const std::vector<int64_t>& train, const std::vector<int64_t>& evaluated,
                                 int64_t vocab_size) {
  if (vocab_size < 1) throw std::invalid_argument("vocab_size must be at least 1, got " + std::to_string(vocab_size));
  if (evaluated.empty()) throw std::invalid_argument("the evaluated split is empty");
  auto check = [&](int64_t id, const char* split) {
    if (id < 0 || id >= vocab_size) {
      throw std::invalid_argument(std::string("the ") + split + " split holds id " + std::to_string(id) +
                                  ", outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
    }
  };
  std::vector<int64_t> counts(vocab_size, 0);
  for (int64_t id : train) {
    check(id, "train");
    ++counts[id];
  }
  const double total = static_cast<double>(train.size()) + static_cast<double>(vocab_size);
  std::vector<double> log_p(vocab_size);
  UnigramBaseline baseline;
  for (int64_t w = 0; w < vocab_size; ++w) {
    log_p[w] = std::log((static_cast<double>(counts[w]) + 1.0) / total);
    baseline.train_entropy -= std::exp(log_p[w]) * log_p[w];
  }
  double sum = 0;
  for (int64_t id : evaluated) {
    check(id, "evaluated");
    sum -= log_p[id];
  }
  baseline.cross_entropy = sum / static_cast<double>(evaluated.size());
  return baseline;
}

}  // namespace conveyor::examples
