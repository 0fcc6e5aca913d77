#pragma once
// Files written all or nothing (checkpoints, saved models, traces): a reader
// or a crash never sees half a file.

#include <functional>
#include <ostream>
#include <string>
#include <vector>

namespace conveyor {

// `write` fills a temporary file beside `path`, which is flushed to disk and
// renamed over `path`. Any failure (`write` throwing included) removes the
// temporary, leaves an existing `path` as it was, and throws
// std::runtime_error("conveyor: saving <path> failed, nothing was written: ...").
void write_atomically(const std::string& path, const std::function<void(std::ostream&)>& write);
void write_atomically(const std::string& path, const std::vector<char>& bytes);

}  // namespace conveyor
