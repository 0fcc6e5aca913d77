# The model's pieces: a stage (a slice of layers on a device), the split
# that places them (stage_split.h), their own random streams, tied
# parameters, the names the original model gives their tensors, and a
# snapshot of what measuring the model changes. Includes support/ and
# core/'s types and errors only.
target_sources(conveyor PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/microbatches.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_names.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_snapshot.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stage.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stage_split.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stage_random.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tied_parameters.cpp)
