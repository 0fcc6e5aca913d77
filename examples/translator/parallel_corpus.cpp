#include "examples/translator/parallel_corpus.h"

#include "examples/common/text_corpus.h"

#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <unordered_map>

namespace conveyor::examples {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kPilcrow = "\xC2\xB6";  // ¶

// Lines of `text` without their '\n' (and '\r').
std::vector<std::string_view> lines_of(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    pos = end + 1;
  }
  return lines;
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

// "Genesis 1:1: text" -> reference "Genesis 1:1", text; false for any other line.
bool split_verse_line(std::string_view line, std::string_view& reference, std::string_view& text) {
  while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
  const size_t colon = line.find(':');                                                // chapter:verse
  const size_t end = colon == line.npos ? line.npos : line.find(':', colon + 1);      // closes the reference
  const size_t space = colon == line.npos ? line.npos : line.rfind(' ', colon);       // before the chapter
  if (end == line.npos || space == line.npos || space == 0) return false;
  if (!all_digits(line.substr(space + 1, colon - space - 1)) || !all_digits(line.substr(colon + 1, end - colon - 1))) {
    return false;
  }
  reference = line.substr(0, end);
  text = line.substr(end + 1);
  return true;
}

// A module name goes into a command line: letters, digits and '_' only.
void check_module_name(const std::string& module) {
  const bool plain = !module.empty() && std::all_of(module.begin(), module.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '_';
  });
  if (!plain) throw std::runtime_error("'" + module + "' is not a SWORD module name (letters, digits and '_' only)");
}

bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  const std::string_view dirs = path ? path : "/usr/bin:/bin";
  for (size_t pos = 0; pos <= dirs.size();) {
    size_t end = dirs.find(':', pos);
    if (end == std::string_view::npos) end = dirs.size();
    std::error_code error;
    if (fs::exists(fs::path(dirs.substr(pos, end - pos)) / program, error)) return true;
    pos = end + 1;
  }
  return false;
}

// What `command` prints on stdout; throws when it cannot run or exits non-zero.
std::string output_of(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (!pipe) throw std::runtime_error("cannot run '" + command + "'");
  std::string out;
  char buffer[1 << 16];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe.get())) > 0) out.append(buffer, n);
  const int status = pclose(pipe.release());
  if (status != 0) {
    throw std::runtime_error("'" + command + "' failed (exit status " +
                             std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : status) + ")");
  }
  return out;
}

std::vector<Verse> read_verse_cache(const fs::path& path) {
  std::vector<Verse> verses;
  const std::string text = read_text_file(path.string());
  for (std::string_view line : lines_of(text)) {
    const size_t tab = line.find('\t');
    if (tab == std::string_view::npos) throw std::runtime_error("'" + path.string() + "' is not a verse cache");
    verses.push_back({std::string(line.substr(0, tab)), std::string(line.substr(tab + 1))});
  }
  return verses;
}

void write_verse_cache(const fs::path& path, const std::vector<Verse>& verses) {
  std::error_code error;
  fs::create_directories(path.parent_path(), error);
  const fs::path temporary = path.string() + ".partial";
  {
    std::ofstream out(temporary, std::ios::binary);
    for (const auto& v : verses) out << v.reference << '\t' << v.text << '\n';
    if (!out.flush()) throw std::runtime_error("cannot write the verse cache '" + temporary.string() + "'");
  }
  fs::rename(temporary, path, error);
  if (error) throw std::runtime_error("cannot write the verse cache '" + path.string() + "': " + error.message());
}

// Runs of white space as one space, none at either end.
std::string collapse_white_space(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      if (!out.empty() && out.back() != ' ') out.push_back(' ');
    } else {
      out.push_back(c);
    }
  }
  if (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

}  // namespace

std::string clean_verse_text(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text[i] == '<' && i + 1 < text.size() && (text[i + 1] == 'G' || text[i + 1] == 'H')) {
      size_t end = i + 2;
      while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
      if (end > i + 2 && end < text.size() && text[end] == '>') {  // a Strong's number
        i = end + 1;
        continue;
      }
    }
    if (text[i] == '\\') {  // an OSIS escape such as "\nd ": the backslash and its letters
      size_t end = i + 1;
      while (end < text.size() && std::isalpha(static_cast<unsigned char>(text[end]))) ++end;
      if (end < text.size() && text[end] == '*') ++end;
      i = end;
      continue;
    }
    if (text.substr(i).starts_with(kPilcrow)) {
      i += kPilcrow.size();
      continue;
    }
    const char c = text[i++];
    if (c != '[' && c != ']') out.push_back(c);
  }
  return collapse_white_space(out);
}

std::vector<Verse> parse_diatheke_plain(std::string_view output) {
  std::vector<Verse> verses;
  for (std::string_view line : lines_of(output)) {
    std::string_view reference, text;
    if (!split_verse_line(line, reference, text)) continue;
    std::string cleaned = clean_verse_text(text);
    if (!cleaned.empty()) verses.push_back({std::string(reference), std::move(cleaned)});
  }
  return verses;
}

std::vector<Verse> read_sword_module(const std::string& module, const std::string& cache_dir) {
  check_module_name(module);
  const fs::path cache = fs::path(cache_dir) / (module + ".verses.tsv");
  std::error_code error;
  if (fs::exists(cache, error)) return read_verse_cache(cache);
  if (!on_path("diatheke")) {
    throw std::runtime_error("diatheke is not installed, so the SWORD module " + module +
                             " cannot be read: install Debian's 'diatheke' package (scripts/setup.sh does)");
  }
  std::vector<Verse> verses = parse_diatheke_plain(output_of("diatheke -b " + module + " -f plain -k Gen-Rev"));
  if (verses.empty()) {
    throw std::runtime_error("diatheke printed no verse of the SWORD module " + module +
                             ": it is not installed (Debian's sword-text-kjv holds engKJV2006eb, sword-text-sparv "
                             "spaRV1909eb; scripts/setup.sh installs both; 'diatheke -b system -k modulelist' lists "
                             "the installed modules)");
  }
  write_verse_cache(cache, verses);
  return verses;
}

std::vector<SentencePair> align_by_reference(const std::vector<Verse>& source, const std::vector<Verse>& target) {
  std::unordered_map<std::string_view, const Verse*> by_reference;
  for (const auto& v : target) by_reference.emplace(v.reference, &v);
  std::vector<SentencePair> pairs;
  for (const auto& v : source) {
    const auto it = by_reference.find(v.reference);
    if (it != by_reference.end()) pairs.push_back({v.reference, v.text, it->second->text});
  }
  return pairs;
}

std::vector<SentencePair> read_parallel_files(const std::string& source_path, const std::string& target_path) {
  for (const auto& path : {source_path, target_path}) {
    std::error_code error;
    if (!fs::is_regular_file(path, error)) throw std::runtime_error("the parallel text file '" + path + "' is missing");
  }
  const std::string source_text = read_text_file(source_path), target_text = read_text_file(target_path);
  const auto source = lines_of(source_text), target = lines_of(target_text);
  if (source.size() != target.size()) {
    throw std::runtime_error("the parallel text files differ in length: '" + source_path + "' has " +
                             std::to_string(source.size()) + " lines, '" + target_path + "' has " +
                             std::to_string(target.size()) + " (line i of one must translate line i of the other)");
  }
  std::vector<SentencePair> pairs;
  for (size_t i = 0; i < source.size(); ++i) {
    std::string s = collapse_white_space(source[i]), t = collapse_white_space(target[i]);
    if (!s.empty() && !t.empty()) pairs.push_back({"line " + std::to_string(i + 1), std::move(s), std::move(t)});
  }
  if (pairs.empty()) throw std::runtime_error("the parallel text files '" + source_path + "' and '" + target_path +
                                              "' hold no pair of non-blank lines");
  return pairs;
}

}  // namespace conveyor::examples
