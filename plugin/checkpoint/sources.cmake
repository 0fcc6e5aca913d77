# Checkpoints: a pipeline's whole training state in one file, and optimizer
# state keyed by parameter name; loading checks the whole file first
# (checkpoint_decode, checked_ivalue). Builds on the runner (runner/) and
# the model's pieces; nothing below includes it.
target_sources(conveyor PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/checked_ivalue.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint_decode.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint_file.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint_reshard.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint_set.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_state.cpp
  ${CMAKE_CURRENT_LIST_DIR}/optimizer_state.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stage_optimizer.cpp)
