# The builder: conveyor::Pipeline (plugin/pipeline.h, implemented in
# pipeline.cpp), the one way from a model (torch::nn layers, TorchScript, a
# torch.export program) to a running pipeline, in phases (front_end.h,
# plan.h, then the runner); options read from a dict, the table of every
# option (Python's keywords, the manual's reference), and the one binding
# Python reaches a pipeline by (binding.h), registered as the TorchScript
# class torch.classes.conveyor.Pipeline. Builds on everything else in
# plugin/; only the public pipeline.h above it includes it.
target_sources(conveyor PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/pipeline.cpp
  ${CMAKE_CURRENT_LIST_DIR}/binding.cpp
  ${CMAKE_CURRENT_LIST_DIR}/dict_options.cpp
  ${CMAKE_CURRENT_LIST_DIR}/front_end.cpp
  ${CMAKE_CURRENT_LIST_DIR}/option_table.cpp
  ${CMAKE_CURRENT_LIST_DIR}/plan.cpp
  ${CMAKE_CURRENT_LIST_DIR}/request.cpp)
if(CONVEYOR_TORCHSCRIPT)
  target_sources(conveyor PRIVATE ${CMAKE_CURRENT_LIST_DIR}/torch_class.cpp)
endif()
