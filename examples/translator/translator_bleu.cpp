#include "examples/translator/translator_bleu.h"

#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>

namespace conveyor::examples {

namespace {

// A shell word: single-quoted, with embedded quotes escaped.
std::string quoted(const std::string& text) {
  std::string out = "'";
  for (const char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

void write_lines(const std::string& path, const std::vector<std::string>& lines) {
  std::ofstream out(path, std::ios::binary);
  for (std::string line : lines) {
    for (char& c : line) c = c == '\n' || c == '\r' ? ' ' : c;
    out << line << '\n';
  }
  if (!out.flush()) throw std::runtime_error("cannot write '" + path + "'");
}

double sacrebleu(const std::string& python, const std::string& reference_path, const std::string& hypothesis_path) {
  const std::string command = quoted(python) + " -m sacrebleu " + quoted(reference_path) + " -i " +
                              quoted(hypothesis_path) + " -m bleu -b -w 4 -lc 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (!pipe) throw std::runtime_error("cannot run " + python);
  std::string out;
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe.get())) > 0) out.append(buffer, n);
  const int status = pclose(pipe.release());
  if (status != 0) {
    throw std::runtime_error("scoring BLEU with sacrebleu failed (" + command + "): " + out +
                             (out.find("No module named sacrebleu") != std::string::npos
                                  ? "  sacrebleu is not installed for " + python + ": run scripts/setup.sh"
                                  : ""));
  }
  try {
    return std::stod(out);
  } catch (const std::exception&) {
    throw std::runtime_error("sacrebleu printed no score: '" + out + "'");
  }
}

}  // namespace conveyor::examples
