# The planner: profiles, partitions, time balancing and predicted steps. It
# decides and never runs a step: it includes the model's pieces (model/),
# support/, trace/ and the public types, never the runtime or pipeline.h.
target_sources(conveyor PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/balance_time.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cpu_sharing.cpp
  ${CMAKE_CURRENT_LIST_DIR}/in_order.cpp
  ${CMAKE_CURRENT_LIST_DIR}/link_profile.cpp
  ${CMAKE_CURRENT_LIST_DIR}/partition.cpp
  ${CMAKE_CURRENT_LIST_DIR}/planner.cpp
  ${CMAKE_CURRENT_LIST_DIR}/profile.cpp
  ${CMAKE_CURRENT_LIST_DIR}/search.cpp
  ${CMAKE_CURRENT_LIST_DIR}/update_timing.cpp)
