# Under pip install . (scikit-build-core, SKBUILD), the library is built
# against the torch installed in the environment pip installs into. pip runs
# the build in an isolated environment of its own, which hides that torch
# from the build's Python; `python -I` (no PYTHONPATH) sees the environment's
# site-packages again. Sets CMAKE_PREFIX_PATH for find_package(Torch), or
# stops with what to do.
if(NOT SKBUILD OR Torch_DIR)
  return()
endif()
execute_process(
  COMMAND "${CONVEYOR_PYTHON}" -I -c "import torch, torch.utils; print(torch.utils.cmake_prefix_path)"
  OUTPUT_VARIABLE _conveyor_torch_prefix ERROR_VARIABLE _conveyor_torch_error RESULT_VARIABLE _conveyor_rc
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _conveyor_rc EQUAL 0)
  message(FATAL_ERROR "conveyor: pip install . builds against the torch of the environment it installs into, "
    "and ${CONVEYOR_PYTHON} has none (${_conveyor_torch_error}). Install torch there first "
    "(pip install torch), then pip install . again.")
endif()
list(PREPEND CMAKE_PREFIX_PATH "${_conveyor_torch_prefix}")
