#include "examples/bert/bert_setup.h"

#include "examples/common/progress.h"

#include <ostream>
#include <stdexcept>

namespace conveyor::examples {

const char* const kSetupFlagsHelp = R"(Data, tokenizer and model:
  --fortunes DIR      fortune files (default /usr/share/games/fortunes)
  --vocab N           tokenizer pieces, 2000 by default (trained on first use)
  --tokenizer FILE    a SentencePiece model to use instead (needs pad, bos,
                      eos ids and a [MASK] piece)
  --tokenizer-dir DIR where trained tokenizers are cached (default: the
                      build folder's bert-tokenizer/)
  --seq-len N         pieces per sequence with [CLS] and [SEP], 3..512
                      (default 64); longer fortunes make several sequences
  --masking M         word (whole-word, default) | token
  --hidden N          hidden size (default 64)
  --heads N           attention heads, dividing --hidden (default 2)
  --layers N          encoder layers (default 3)
  --feedforward N     feed-forward size (default 256)
  --dropout P         in [0, 1) (default 0.1)
)";

BertSetup default_setup(const std::string& tokenizer_dir) {
  BertSetup s;
  s.data.tokenizer_dir = tokenizer_dir;
  s.data.split_seed = 2718281828;  // lm_pipeline's split of the fortunes
  return s;
}

void add_setup_flags(Flags& flags, BertSetup& s) {
  flags.text("--fortunes", &s.data.fortune_dir).integer("--vocab", &s.data.vocab, 16, 1'000'000);
  flags.text("--tokenizer", &s.data.tokenizer_model).text("--tokenizer-dir", &s.data.tokenizer_dir);
  flags.integer("--seq-len", &s.data.seq_len, 3, 512);
  flags.on("--masking", [&s](const std::string& flag, const std::string& value) {
    if (value != "word" && value != "token") throw UsageError(flag + " expects word or token, got '" + value + "'");
    s.masking.whole_word = value == "word";
  });
  flags.integer("--hidden", &s.model.hidden, 1, 65536).integer("--heads", &s.model.heads, 1, 1024);
  flags.integer("--layers", &s.model.layers, 1, 64).integer("--feedforward", &s.model.feedforward, 1, 1 << 20);
  flags.real("--dropout", &s.model.dropout, 0.0, 1.0, /*max_included=*/false);
}

MlmData load_setup_data(BertSetup& s, std::ostream& out) {
  if (s.model.hidden % s.model.heads != 0) {
    throw UsageError("--heads (" + std::to_string(s.model.heads) + ") must divide --hidden (" +
                     std::to_string(s.model.hidden) + ")");
  }
  MlmData d;
  try {
    d = load_mlm_data(s.data);
  } catch (const std::exception& e) {
    throw UsageError(std::string(e.what()) +
                     "\n  the fortunes come from Debian's 'fortunes' package and SentencePiece from "
                     "'libsentencepiece-dev' (scripts/setup.sh installs both); --fortunes and --tokenizer name others");
  }
  s.model.vocab = d.tokenizer.size();
  s.model.max_len = s.data.seq_len;
  s.model.pad_id = d.tokenizer.pad_id();
  out << "data: " << d.source << "\n  tokenizer: " << d.tokenizer.size() << " SentencePiece unigram pieces, "
      << (d.trained_tokenizer ? "trained now on the train split: " : "") << d.tokenizer.path()
      << "\n  sequences of up to " << s.data.seq_len << " pieces: train " << format_count(d.train.size())
      << ", valid " << format_count(d.valid.size()) << ", test " << format_count(d.test.size()) << " ("
      << format_count(d.train_pieces) << " train pieces)\n  masking: "
      << (s.masking.whole_word ? "whole words" : "pieces")
      << ", " << s.masking.probability * 100 << "% chosen (80% [MASK], 10% random, 10% kept)\n"
      << "  unigram baseline over the valid pieces: " << fixed(d.valid_unigram.cross_entropy, 3) << " nats\n";
  return d;
}

std::string describe_model(const BertConfig& m) {
  return "BERT, " + std::to_string(m.layers) + " encoder layers, hidden " + std::to_string(m.hidden) + ", " +
         std::to_string(m.heads) + " heads, feed-forward " + std::to_string(m.feedforward) + ", vocabulary " +
         std::to_string(m.vocab) + ", " + std::to_string(m.max_len) + " positions, dropout " + fixed(m.dropout, 2);
}

}  // namespace conveyor::examples
