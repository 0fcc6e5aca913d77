#pragma once
// A .pt2 archive as torch.export.save writes it: a zip holding the program's
// JSON (models/<name>.json), its weights and constants (raw bytes described
// by data/weights/<name>_weights_config.json and
// data/constants/<name>_constants_config.json), sample inputs and version
// records.

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

namespace conveyor::exported {

struct Archive {
  std::string path;
  std::string program_json;
  std::map<std::string, at::Tensor> weights;    // parameters and buffers, by the model's names, on the CPU
  std::map<std::string, at::Tensor> constants;  // lifted tensor constants, by name
};

// Reads `path`. Throws std::invalid_argument naming the path and the problem:
// a missing file; a file that is no zip archive (truncated or corrupt); a zip
// that holds no ExportedProgram (a TorchScript archive, a torch.save file);
// weights it cannot read (pickled tensor subclasses, a big-endian archive,
// a record shorter than its tensor).
Archive read_archive(const std::string& path);

}  // namespace conveyor::exported
