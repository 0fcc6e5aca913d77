# Measuring, for the planner: a model's layers profiled (profile_layers,
# profile_model; in order, sharing the CPU, with their updates), the links
# between stages in a process (link_profile) and between processes over c10d
# (c10d_link), and whole plans raced on a batch (race_candidates). Each runs
# real pipelines or ranks, so it builds on the runner (runner/) and
# distributed/; only the builder and the umbrella header include it.
target_sources(conveyor PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/c10d_link.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cpu_sharing.cpp
  ${CMAKE_CURRENT_LIST_DIR}/in_order.cpp
  ${CMAKE_CURRENT_LIST_DIR}/link_profile.cpp
  ${CMAKE_CURRENT_LIST_DIR}/profile_layers.cpp
  ${CMAKE_CURRENT_LIST_DIR}/profile_model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/update_timing.cpp
  ${CMAKE_CURRENT_LIST_DIR}/race_candidates.cpp)
