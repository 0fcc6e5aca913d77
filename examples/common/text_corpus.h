#pragma once
// Text for the language-model example: tokenising, a frequency-ranked
// vocabulary, a deterministic train / valid / test split, the unigram
// baseline a model has to beat, and the [batch, bptt] windows it trains on.
// Plain C++ (no LibTorch) so that it builds and tests in seconds.
//
// Two sources:
//  - fortune files (Debian's `fortunes` package, /usr/share/games/fortunes):
//    English quotations separated by lines holding only '%';
//  - PTB-format files (ptb.{train,valid,test}.txt): one sentence per line,
//    words separated by spaces, already tokenised.
// Both give one token stream per split with kEos closing every fortune or line.

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace conveyor::examples {

inline constexpr std::string_view kUnk = "<unk>";  // every word outside the vocabulary
inline constexpr std::string_view kEos = "<eos>";  // ends a fortune (or a PTB line)

// A whole file's bytes; throws std::runtime_error naming the path when it
// cannot be opened or read.
std::string read_text_file(const std::string& path);

// Lower-cases and splits into words and punctuation. A word is a run of
// letters, digits and non-ASCII bytes (UTF-8 stays intact), with apostrophes
// inside it kept ("don't"). Every other printable character is punctuation; a
// run of the same punctuation character is one token ("...", "--", "!!!").
std::vector<std::string> tokenize(std::string_view text);

// The entries of a fortune file, in order: the text between lines that hold
// only '%' (trailing spaces and '\r' ignored). Entries with no visible
// character are dropped.
std::vector<std::string> split_fortunes(std::string_view file_text);

class Vocabulary {
 public:
  // The `max_size` most frequent tokens of `tokens`, id 0 being kUnk (so at
  // most max_size - 1 others). Ties in frequency go to the token that sorts
  // first, so the ids do not depend on the order of the text. A kUnk already
  // in the text is counted as id 0, never ranked. Throws
  // std::invalid_argument if max_size < 2.
  static Vocabulary build(const std::vector<std::string>& tokens, int64_t max_size);

  int64_t size() const { return static_cast<int64_t>(words_.size()); }
  int64_t id(const std::string& word) const;  // 0 (kUnk) when absent
  const std::string& word(int64_t id) const;  // throws std::out_of_range
  std::vector<int64_t> encode(const std::vector<std::string>& tokens) const;

 private:
  std::vector<std::string> words_;
  std::unordered_map<std::string, int64_t> ids_;
};

// Which split a fortune goes to: a hash of its text and the seed, so the
// split depends neither on file order nor on the other entries, and equal
// entries land together. About 90% train, 5% valid, 5% test.
enum class Split { kTrain, kValid, kTest };
// The hash split_of uses: stable across runs, platforms and builds.
uint64_t stable_hash(std::string_view text, uint64_t seed);
Split split_of(std::string_view entry, uint64_t seed);

struct Corpus {
  std::string source;  // what was read, for the user: "42 fortune files in /usr/share/..."
  Vocabulary vocab;
  std::vector<int64_t> train, valid, test;                         // token ids, kEos included
  int64_t train_entries = 0, valid_entries = 0, test_entries = 0;  // fortunes or lines
  int64_t distinct_train_words = 0;                                // before the vocabulary cap
};

// The fortunes of every fortune file of `dir`, in file-name order, and what
// was read ("42 fortune files in /usr/share/..."). Which files count and the
// errors are those of load_fortunes.
struct FortuneEntries {
  std::string source;
  std::vector<std::string> entries;
};
FortuneEntries read_fortunes(const std::string& dir);

// Every fortune file of `dir`, read in name order: the "*.dat" indexes, the
// "*.u8" links and anything that is not a regular file (the "off"
// subdirectory of offensive ones, if present) are skipped. The vocabulary
// comes from the train split. Throws std::runtime_error naming the path when `dir` is
// missing, holds no fortune file, or a split ends up empty.
Corpus load_fortunes(const std::string& dir, int64_t max_vocab, uint64_t seed);

// ptb.train.txt, ptb.valid.txt and ptb.test.txt of `dir`, split on white
// space as they are (no lower-casing), kEos after every non-blank line. The
// vocabulary comes from the train file. Throws std::runtime_error naming the
// path when `dir` or a file is missing, unreadable, or holds no token.
Corpus load_ptb(const std::string& dir, int64_t max_vocab);

// A token stream cut into `rows` equal, contiguous streams laid side by side,
// row-major [rows, cols]: row r holds stream[r * cols, (r + 1) * cols). The
// remainder of the stream is dropped. Window i covers columns
// [i * bptt, i * bptt + len) as inputs and the columns one to the right as
// targets; the last window may be shorter.
struct TokenGrid {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<int64_t> ids;

  struct Window {
    int64_t len = 0;                       // time steps
    std::vector<int64_t> inputs, targets;  // row-major [rows, len]
  };
  int64_t num_windows(int64_t bptt) const;           // throws std::invalid_argument if bptt < 1
  Window window(int64_t index, int64_t bptt) const;  // throws std::out_of_range
};

// Throws std::invalid_argument naming `what` (e.g. "valid") when rows < 1 or
// the stream has fewer than 2 tokens per row.
TokenGrid batchify(const std::vector<int64_t>& stream, int64_t rows, const std::string& what);

// The model to beat: a unigram model of the train split with add-one
// smoothing over the vocabulary, p(w) = (count(w) + 1) / (N + V).
struct UnigramBaseline {
  double train_entropy = 0;   // nats per token: entropy of that distribution
  double cross_entropy = 0;   // nats per token on the evaluated split
  double perplexity() const;  // exp(cross_entropy)
};
// Throws std::invalid_argument if `evaluated` is empty, vocab_size < 1 or an
// id lies outside [0, vocab_size).
UnigramBaseline unigram_baseline(const std::vector<int64_t>& train, const std::vector<int64_t>& evaluated,
                                 int64_t vocab_size);

}  // namespace conveyor::examples
