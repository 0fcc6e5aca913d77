#pragma once
// Verse-aligned text for the translator (and any example that wants the
// Bible's verses as sentences): Debian's SWORD modules read with diatheke,
// or a pair of plain parallel text files. Plain C++ (no LibTorch).
//
//   auto english = read_sword_module("engKJV2006eb", cache_dir);   // King James Version
//   auto spanish = read_sword_module("spaRV1909eb", cache_dir);    // Reina-Valera 1909
//   std::vector<SentencePair> pairs = align_by_reference(english, spanish);
//
// Modules come from Debian's sword-text-kjv and sword-text-sparv packages
// (installed by scripts/setup.sh); diatheke reads their local files, so
// nothing is downloaded. The first read of a module runs diatheke once
// (a few seconds) and keeps the parsed verses in cache_dir.

#include <string>
#include <string_view>
#include <vector>

namespace conveyor::examples {

struct Verse {
  std::string reference;  // "Genesis 1:1", "I John 2:23", "Revelation of John 22:21"
  std::string text;       // markup stripped, white space collapsed
};

// Strips what the modules mark their text with: Strong's numbers ("<G5547>",
// "<H430>"), OSIS escapes ("\nd " before the divine name), paragraph signs
// (¶) and the brackets around words the KJV translators supplied ("[but]"
// reads "but"); collapses white space and trims.
std::string clean_verse_text(std::string_view text);

// The verses of `diatheke -f plain` output: one line per verse,
// "<book> <chapter>:<verse>: <text>" (leading white space allowed). Other
// lines are not verse text and are skipped: the "(module)" line closing the
// output, and the psalm headings some modules print after each verse. Verses
// whose text is empty after cleaning (the module has none there) are dropped.
std::vector<Verse> parse_diatheke_plain(std::string_view output);

// Every verse of the SWORD module `module` (Genesis to Revelation). The first
// call runs diatheke and writes the verses to cache_dir/<module>.verses.tsv
// (one "reference<TAB>text" line each; written atomically); later calls read
// that file. Throws std::runtime_error naming the cause when diatheke is not
// installed, the module is not (diatheke prints no verse), or the cache
// cannot be written.
std::vector<Verse> read_sword_module(const std::string& module, const std::string& cache_dir);

// One sentence and its translation.
struct SentencePair {
  std::string reference;  // the verse reference, or "line N" of parallel files
  std::string source, target;
};

// The verses whose reference both lists hold, in the source's order, each
// with its text in both. References present in only one are left out.
std::vector<SentencePair> align_by_reference(const std::vector<Verse>& source, const std::vector<Verse>& target);

// Line i of `source_path` with line i of `target_path` ("line i", 1-based);
// white space is collapsed (no markup is stripped) and a line blank on
// either side is skipped. Throws std::runtime_error naming the file when one
// is missing or unreadable, naming both files and their line counts when the
// counts differ, and when no pair is left.
std::vector<SentencePair> read_parallel_files(const std::string& source_path, const std::string& target_path);

}  // namespace conveyor::examples
