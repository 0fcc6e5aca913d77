#pragma once
// A checkpoint that several processes wrote, one file each (a multi-process
// pipeline's: each process saves its own stages; with the optimizer state
// sharded across replicas, each replica its part of it), merged into the
// checkpoint of the whole pipeline, which loads at any number of stages and
// replicas (plugin/checkpoint/checkpoint.h): every stage's entry from a file
// that holds it (replicas of a stage save the same weights), the sharded
// optimizer states put together from the parts of all their replicas, the
// model's values from all files, the rest (random generators, loss scaler,
// schedule and options) from the first.

#include <ATen/core/Dict.h>

#include <string>
#include <vector>

namespace conveyor {

struct CheckpointFile {
  std::string path;         // what messages call it
  std::vector<char> bytes;  // its content
};

// Reads each file whole; throws std::invalid_argument naming one that cannot be read.
std::vector<CheckpointFile> read_checkpoint_files(const std::vector<std::string>& paths);

// The dict of one checkpoint of the whole pipeline (read_checkpoint's, when
// there is one file). Throws std::invalid_argument, changing nothing, for a
// file that is not an intact checkpoint, files of different pipelines or
// steps, a stage that no file holds, a sharded optimizer state with a
// replica's part missing (each named), and files holding state of an
// optimizer the caller owns (TrainingState::optimizers), which is per process.
c10::impl::GenericDict merge_checkpoints(const std::vector<CheckpointFile>& files);

// How messages name several files: "a, b, c, d and 2 more".
std::string files_label(const std::vector<std::string>& paths);

}  // namespace conveyor
