# Checkpoints: a pipeline's whole training state in one file, and optimizer
# state keyed by parameter name.
target_sources(conveyor PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint_file.cpp
  ${CMAKE_CURRENT_LIST_DIR}/optimizer_state.cpp)
