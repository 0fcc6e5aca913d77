# The planner: what a profile says a plan costs, partitions, time balancing,
# predicted steps and the search. It decides and never runs anything (the
# measuring that fills a profile is plugin/measure/'s): it includes the
# model's pieces (model/), support/, trace/ and the public types, never the
# runtime or pipeline.h.
target_sources(conveyor PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/balance_time.cpp
  ${CMAKE_CURRENT_LIST_DIR}/partition.cpp
  ${CMAKE_CURRENT_LIST_DIR}/planner.cpp
  ${CMAKE_CURRENT_LIST_DIR}/profile.cpp
  ${CMAKE_CURRENT_LIST_DIR}/search.cpp
  ${CMAKE_CURRENT_LIST_DIR}/predict_synthesised.cpp)
