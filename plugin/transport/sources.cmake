# How stages hand each other activations and gradients: the interface, the
# in-process transport (worker threads, mailboxes) and the c10d one (worker
# processes). Includes support/ and the public types, never the runtime, the
# planner, the model's pieces or a front end.
target_sources(conveyor PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/transport.cpp
  ${CMAKE_CURRENT_LIST_DIR}/in_process.cpp
  ${CMAKE_CURRENT_LIST_DIR}/c10d.cpp
  ${CMAKE_CURRENT_LIST_DIR}/c10d_header.cpp
  ${CMAKE_CURRENT_LIST_DIR}/c10d_step.cpp
  ${CMAKE_CURRENT_LIST_DIR}/c10d_ties.cpp
  ${CMAKE_CURRENT_LIST_DIR}/shared_memory.cpp)
