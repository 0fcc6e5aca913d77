#pragma once
// BLEU for the translator, computed by sacrebleu (the reference
// implementation, installed into the project's .venv by scripts/setup.sh):
// hypotheses and references are written one sentence a line, detokenised,
// and `python -m sacrebleu` scores them, case-insensitively (-lc; the model
// writes lower case) with its default 13a tokenisation.

#include <string>
#include <vector>

namespace conveyor::examples {

// Writes `lines` to `path`, one a line (newlines inside a line become spaces).
void write_lines(const std::string& path, const std::vector<std::string>& lines);

// Corpus BLEU (0..100) of the hypothesis file against the reference file.
// Throws std::runtime_error naming the interpreter when `python` cannot run
// sacrebleu (not installed: run scripts/setup.sh), or sacrebleu fails.
double sacrebleu(const std::string& python, const std::string& reference_path, const std::string& hypothesis_path);

}  // namespace conveyor::examples
