// conveyor_checkpoint: checkpoints outside a training run.
//
//   conveyor_checkpoint merge  OUT FILE...   every process's file of one step
//                                            of a multi-process run -> one
//                                            checkpoint of the whole pipeline,
//                                            which resumes at any layout
//   conveyor_checkpoint export OUT FILE...   the plain state dict of the model
//                                            ({name: tensor}) that Python's
//                                            torch.load reads
//
// FILE... is one checkpoint file or every rank's file of one step, in any
// order. A missing, damaged or foreign file is refused with its name, and
// OUT is not written.

#include "plugin/checkpoint/checkpoint.h"
#include "plugin/checkpoint/model_state.h"

#include <exception>
#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  const std::string usage = "usage: conveyor_checkpoint merge|export OUT FILE...\n";
  if (argc < 4) {
    std::cerr << usage;
    return 2;
  }
  const std::string command = argv[1], out = argv[2];
  const std::vector<std::string> files(argv + 3, argv + argc);
  try {
    if (command == "merge") {
      conveyor::merge_checkpoint_files(files, out);
    } else if (command == "export") {
      conveyor::export_model_state(files, out);
    } else {
      std::cerr << "unknown command '" << command << "'\n" << usage;
      return 2;
    }
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  std::cout << "wrote " << out << " from " << files.size() << " file" << (files.size() == 1 ? "" : "s") << "\n";
  return 0;
}
