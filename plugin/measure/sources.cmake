# Measuring, for the planner: a model's layers profiled (profile_model), the
# link between processes over c10d (c10d_link), and whole plans raced on a
# batch (tune_plan). Each runs real pipelines or ranks, so it builds on the
# public entry point and distributed/; only the builder and the umbrella
# header include it.
target_sources(conveyor PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/c10d_link.cpp
  ${CMAKE_CURRENT_LIST_DIR}/profile_model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tune_plan.cpp)
