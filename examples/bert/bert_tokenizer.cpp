#include "examples/bert/bert_tokenizer.h"

#include "examples/common/text_corpus.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <stdexcept>
#include <unistd.h>

namespace conveyor::examples {

namespace fs = std::filesystem;

namespace {

constexpr const char* kMask = "[MASK]";
constexpr const char* kWordStart = "\xe2\x96\x81";  // U+2581, SentencePiece's space

// Fixed ids for the special pieces, one thread and the input read in order:
// the same text and settings give the same model on every machine.
std::string trainer_flags(int64_t vocab_size) {
  return "--model_type=unigram --vocab_size=" + std::to_string(vocab_size) +
         " --pad_id=0 --unk_id=1 --bos_id=2 --eos_id=3 --user_defined_symbols=" + kMask +
         " --num_threads=1 --shuffle_input_sentence=false --input_sentence_size=0 --minloglevel=2";
}

}  // namespace

SubwordTokenizer SubwordTokenizer::load(const std::string& model_path) {
  std::error_code error;
  if (!fs::is_regular_file(model_path, error)) {
    throw std::runtime_error("the tokenizer model '" + model_path + "' does not exist");
  }
  SubwordTokenizer t;
  t.sp_ = std::make_shared<sentencepiece::SentencePieceProcessor>();
  if (const auto status = t.sp_->Load(model_path); !status.ok()) {
    throw std::runtime_error("cannot load the tokenizer model '" + model_path + "': " + status.ToString());
  }
  t.path_ = model_path;
  t.size_ = t.sp_->GetPieceSize();
  t.pad_ = t.sp_->pad_id();
  t.cls_ = t.sp_->bos_id();
  t.sep_ = t.sp_->eos_id();
  t.mask_ = t.sp_->PieceToId(kMask);
  if (t.pad_ < 0 || t.cls_ < 0 || t.sep_ < 0 || t.mask_ == t.sp_->unk_id()) {
    throw std::runtime_error("the tokenizer model '" + model_path +
                             "' lacks a pad, bos or eos id or the [MASK] piece (train it with --pad_id, "
                             "--bos_id, --eos_id and --user_defined_symbols=[MASK])");
  }
  return t;
}

std::string SubwordTokenizer::train_cached(const std::vector<std::string>& texts, int64_t vocab_size,
                                           const std::string& dir, bool* trained) {
  uint64_t hash = stable_hash(trainer_flags(vocab_size), 0);
  for (const auto& text : texts) hash = stable_hash(text, hash);
  std::ostringstream name;
  name << "fortunes-unigram-" << vocab_size << "-" << std::hex << std::setw(16) << std::setfill('0') << hash;
  const fs::path model = fs::path(dir) / (name.str() + ".model");
  *trained = false;
  std::error_code error;
  if (fs::is_regular_file(model, error)) return model.string();

  fs::create_directories(dir, error);
  if (!fs::is_directory(dir, error)) {
    throw std::runtime_error("cannot create the tokenizer folder '" + dir + "'");
  }
  // Private names, renamed into place at the end: concurrent first uses
  // (tests run in parallel) each train, and the last rename wins whole.
  const std::string temp = (fs::path(dir) / (name.str() + ".tmp" + std::to_string(::getpid()))).string();
  {
    std::ofstream out(temp + ".txt");
    for (std::string text : texts) {
      for (char& c : text) c = (c == '\n' || c == '\r' || c == '\t') ? ' ' : c;
      out << text << "\n";
    }
    if (!out) throw std::runtime_error("cannot write the tokenizer's training text '" + temp + ".txt'");
  }
  const auto status = sentencepiece::SentencePieceTrainer::Train("--input=" + temp + ".txt --model_prefix=" + temp +
                                                                 " " + trainer_flags(vocab_size));
  fs::remove(temp + ".txt", error);
  fs::remove(temp + ".vocab", error);
  if (!status.ok()) {
    fs::remove(temp + ".model", error);
    throw std::runtime_error("SentencePiece could not train a " + std::to_string(vocab_size) +
                             "-piece tokenizer: " + status.ToString());
  }
  fs::rename(temp + ".model", model);
  *trained = true;
  return model.string();
}

std::vector<int64_t> SubwordTokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  sp_->Encode(text, &ids);
  return {ids.begin(), ids.end()};
}

bool SubwordTokenizer::starts_word(int64_t id) const {
  return is_ordinary(id) && sp_->IdToPiece(static_cast<int>(id)).starts_with(kWordStart);
}

bool SubwordTokenizer::is_ordinary(int64_t id) const {
  const int i = static_cast<int>(id);
  return id >= 0 && id < size_ && id != mask_ && !sp_->IsControl(i) && !sp_->IsUnknown(i) && !sp_->IsUnused(i);
}

std::string SubwordTokenizer::piece(int64_t id) const { return sp_->IdToPiece(static_cast<int>(id)); }

}  // namespace conveyor::examples
