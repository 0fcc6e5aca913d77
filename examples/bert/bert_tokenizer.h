#pragma once
// The BERT example's subword tokenizer: a SentencePiece unigram model trained
// on the train split of the text the first time it is asked for, cached in a
// folder (the build folder by default) under a name that records the
// vocabulary size and a hash of the text, so changed text or settings train a
// new model and an unchanged one is reused.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace conveyor::examples {

class SubwordTokenizer {
 public:
  // Loads a SentencePiece model file; throws std::runtime_error naming the
  // path when it is missing or not a model, or lacks the [MASK] piece and the
  // pad, bos ([CLS]) and eos ([SEP]) ids this example needs.
  static SubwordTokenizer load(const std::string& model_path);

  // The path of a unigram model of `vocab_size` pieces trained on `texts`
  // (one sentence a line: new lines become spaces) in `dir`, training it
  // first when it is not there (`*trained` says which). Deterministic: one
  // thread, no sampling of the input. Throws std::runtime_error naming the
  // folder or SentencePiece's reason when training fails.
  static std::string train_cached(const std::vector<std::string>& texts, int64_t vocab_size, const std::string& dir,
                                  bool* trained);

  std::vector<int64_t> encode(const std::string& text) const;
  // Whether piece `id` begins a word (SentencePiece marks a preceding space
  // with U+2581); special pieces never do.
  bool starts_word(int64_t id) const;
  // Whether `id` is an ordinary piece (neither special nor [MASK]): what a
  // random replacement may draw.
  bool is_ordinary(int64_t id) const;
  std::string piece(int64_t id) const;

  int64_t size() const { return size_; }
  int64_t pad_id() const { return pad_; }
  int64_t cls_id() const { return cls_; }  // SentencePiece's bos
  int64_t sep_id() const { return sep_; }  // SentencePiece's eos
  int64_t mask_id() const { return mask_; }
  const std::string& path() const { return path_; }

 private:
  std::shared_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string path_;
  int64_t size_ = 0, pad_ = 0, cls_ = 0, sep_ = 0, mask_ = 0;
};

}  // namespace conveyor::examples
