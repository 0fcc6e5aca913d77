# ctest driver: install the built plugin into a scratch prefix, then configure,
# build and run tests/consumer against it with find_package(conveyor).
foreach(var BUILD_DIR SOURCE_DIR WORK_DIR TORCH_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run.cmake needs -D${var}=...")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK_DIR}")
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
endfunction()
run(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix")
# Only the public headers are installed: the entry point and what it
# includes, never the runtime's internals or the test hooks.
set(_include "${WORK_DIR}/prefix/include/conveyor")
foreach(public conveyor.h plugin/runner/stage_runner.h plugin/version.h plugin/model/stage.h plugin/planner/planner.h
               plugin/checkpoint/checkpoint.h plugin/distributed/distributed_runner.h)
  if(NOT EXISTS "${_include}/${public}")
    message(FATAL_ERROR "public header ${public} was not installed")
  endif()
endforeach()
foreach(internal plugin/runtime plugin/support/fault_injection.h plugin/transport/mailbox.h
                 plugin/transport/c10d_state.h plugin/checkpoint/checkpoint_decode.h)
  if(EXISTS "${_include}/${internal}")
    message(FATAL_ERROR "internal ${internal} was installed")
  endif()
endforeach()
# The installed library points into no directory of the build machine (its
# virtual environment, the build tree): whoever links it links LibTorch too.
file(GLOB _installed_libs "${WORK_DIR}/prefix/lib*/libconveyor.so.*.*")
if(NOT _installed_libs)
  message(FATAL_ERROR "libconveyor.so was not installed under ${WORK_DIR}/prefix/lib")
endif()
foreach(lib IN LISTS _installed_libs)
  file(READ_ELF "${lib}" RPATH _rpath RUNPATH _runpath)
  if(_rpath OR _runpath)
    message(FATAL_ERROR "installed ${lib} has RPATH '${_rpath}' RUNPATH '${_runpath}': it must carry none")
  endif()
endforeach()
# The Python package's files are not part of a plain install.
if(EXISTS "${WORK_DIR}/prefix/conveyor")
  message(FATAL_ERROR "cmake --install installed the Python package's files (component python) too")
endif()
run(${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/consumer" -B "${WORK_DIR}/build" -G Ninja
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DTorch_DIR=${TORCH_DIR}
    -DCONVEYOR_MINIMAL_EXAMPLE=${SOURCE_DIR}/examples/minimal.cpp)
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run("${WORK_DIR}/build/consumer")
run("${WORK_DIR}/build/minimal")
