# Per-call choice between a fused kernel and the op it replaces, from a table
# of measurements compiled into the library; included by ops/sources.cmake.
set(_table ${CMAKE_CURRENT_LIST_DIR}/fused_dispatch_table.txt)
set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_table})
file(READ ${_table} CONVEYOR_DISPATCH_TABLE_TEXT)
configure_file(${CMAKE_CURRENT_LIST_DIR}/fused_dispatch_table.cpp.in
  ${PROJECT_BINARY_DIR}/generated/fused_dispatch_table.cpp @ONLY)
target_sources(conveyor PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/fused_dispatch.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fused_kernels.cpp
  ${PROJECT_BINARY_DIR}/generated/fused_dispatch_table.cpp)
