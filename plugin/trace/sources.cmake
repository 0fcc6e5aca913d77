# Pictures of a step: timelines (SVG) of predicted and measured steps.
# Includes support/ and the public step result only.
target_sources(conveyor PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/timeline.cpp)
