# The runtime: executes a schedule over stages and a transport. One file per
# responsibility: the step loop (runtime.cpp), forward and backward actions
# (actions.cpp), the split backward (split_backward.cpp), offloading
# (offload.cpp), the order between the caller's stream and the workers'
# (stream_order.cpp), tied-parameter gradients (tied_gradients.cpp), the optimizer
# step and the divergence guard (optimizer_step.cpp), the update after a step
# (update.cpp: loss scaler verdicts, clipping by global norm; loss_scaler.cpp,
# autocast.h), and the bookkeeping
# classes (activation stash, weight versions, workers, timer, rollback). It includes
# the model's pieces (model/), support/, transport/ and the public types, and
# never the planner, a front end (script/), distributed/, checkpoint/ or
# pipeline.h.
target_sources(conveyor PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/action_timer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/activation_stash.cpp
  ${CMAKE_CURRENT_LIST_DIR}/actions.cpp
  ${CMAKE_CURRENT_LIST_DIR}/loss_scaler.cpp
  ${CMAKE_CURRENT_LIST_DIR}/offload.cpp
  ${CMAKE_CURRENT_LIST_DIR}/optimizer_step.cpp
  ${CMAKE_CURRENT_LIST_DIR}/runtime.cpp
  ${CMAKE_CURRENT_LIST_DIR}/split_backward.cpp
  ${CMAKE_CURRENT_LIST_DIR}/step_rollback.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stream_order.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tied_gradients.cpp
  ${CMAKE_CURRENT_LIST_DIR}/update.cpp
  ${CMAKE_CURRENT_LIST_DIR}/weight_versions.cpp
  ${CMAKE_CURRENT_LIST_DIR}/workers.cpp)
