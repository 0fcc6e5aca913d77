# How stages hand each other activations and gradients: the interface, the
# in-process transport (threads, mailboxes) and the c10d one (processes).
target_sources(conveyor PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/transport.cpp
  ${CMAKE_CURRENT_LIST_DIR}/in_process.cpp
  ${CMAKE_CURRENT_LIST_DIR}/c10d.cpp
  ${CMAKE_CURRENT_LIST_DIR}/c10d_header.cpp
  ${CMAKE_CURRENT_LIST_DIR}/c10d_step.cpp
  ${CMAKE_CURRENT_LIST_DIR}/c10d_ties.cpp)
