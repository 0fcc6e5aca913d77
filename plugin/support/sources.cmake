# Support every other folder may use: atomic file writes, the fault-injection
# points, tensor-list helpers, the clock and the median. Includes nothing else
# of the plugin but the error types.
target_sources(conveyor PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/atomic_file.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fault_injection.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tensors.cpp)
