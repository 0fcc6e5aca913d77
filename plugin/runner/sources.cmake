# StageRunner: a model's layers cut into stages, built on this process's
# workers (all of them, or one worker of a pipeline across processes) and run
# by the runtime under a schedule. The public Pipeline (plugin/pipeline.h)
# builds one; script/, export/, distributed/, checkpoint/, measure/ and
# builder/ build on it.
target_sources(conveyor PRIVATE ${CMAKE_CURRENT_LIST_DIR}/stage_runner.cpp)
