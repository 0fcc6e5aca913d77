#pragma once
// What bert_pipeline and bert_study share on their command lines: the data,
// tokenizer, masking and model flags, their help text, and loading the data
// with errors that say what to do.

#include "examples/bert/bert_data.h"
#include "examples/bert/bert_model.h"
#include "examples/common/flags.h"

#include <iosfwd>
#include <string>

namespace conveyor::examples {

struct BertSetup {
  MlmDataOptions data;
  BertConfig model;
  Masking masking;
};

// The defaults (the tokenizer cached in `tokenizer_dir`) and the flags that change them.
BertSetup default_setup(const std::string& tokenizer_dir);
void add_setup_flags(Flags& flags, BertSetup& setup);
extern const char* const kSetupFlagsHelp;

// Loads the data, sets the model's vocabulary, positions and pad id from it,
// prints what was read to `out`. Missing text or tokenizer, a bad model file
// or a sequence length that cannot fit throw UsageError naming the cause.
MlmData load_setup_data(BertSetup& setup, std::ostream& out);

// "BERT, 3 encoder layers, hidden 64, ...": the model in one line.
std::string describe_model(const BertConfig& model);

}  // namespace conveyor::examples
