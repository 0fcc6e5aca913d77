# The schedule library: schedules as data (actions, text, generators, the
# V shapes, the synthesiser), their validator, simulator and memory, and
# sharding as actions. It needs no LibTorch: the main build makes it an
# object library the plugin and its tests link, and tests/fuzz compiles it
# into the schedule fuzzer; both read this one list.
set(CONVEYOR_SCHEDULES_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/action.cpp
  ${CMAKE_CURRENT_LIST_DIR}/blocking_replay.cpp
  ${CMAKE_CURRENT_LIST_DIR}/generators.cpp
  ${CMAKE_CURRENT_LIST_DIR}/modulo.cpp
  ${CMAKE_CURRENT_LIST_DIR}/schedule.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sharding.cpp
  ${CMAKE_CURRENT_LIST_DIR}/simulate.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stash_memory.cpp
  ${CMAKE_CURRENT_LIST_DIR}/synthesise.cpp
  ${CMAKE_CURRENT_LIST_DIR}/v_shape.cpp
  ${CMAKE_CURRENT_LIST_DIR}/validate.cpp)
