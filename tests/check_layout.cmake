# The source tree's rules, checked by ctest (source_layout):
#  - layers, one direction: schedules/ <- ops/ <- plugin/ <- examples,
#    benchmarks, tests. schedules/ includes neither ops/ nor plugin/; ops/
#    never includes plugin/;
#  - inside plugin/, each folder includes only the folders below it:
#      support/    nothing of the plugin
#      core/       the foundation (errors, types, every option's row, the
#                  options and their values, step results): support/ only
#      model/      support/ and core/'s types and errors (not the options,
#                  their rows and values, or the step result)
#      trace/      support/, core/'s types and errors and the step result
#                  (not the options, their rows and values)
#      planner/    model/, trace/, support/ and core/; never the runtime, a
#                  transport or the runner
#      transport/  support/ and core/ but the options; never the runtime
#      runtime/    model/, transport/, support/ and core/ but the options (it
#                  takes their sections); never the planner or the runner
#      runner/     (StageRunner) everything above; never script/, export/,
#                  distributed/, checkpoint/, measure/ or builder/, which
#                  build on it; its headers never include the runtime's
#      script/, export/, distributed/, checkpoint/ build on all of the above
#                  and never include measure/ or builder/;
#      measure/    (profiling a model, timing links and plans) builds on all of
#                  the above but script/, export/ and checkpoint/;
#      builder/    (conveyor::Pipeline's phases) builds on all of the above;
#      the root    what a user includes: pipeline.h (the one class a user
#                  builds), conveyor.h (everything a user may name) and
#                  version.h (which anything may include), on top of
#                  everything; no folder includes pipeline.h but builder/,
#                  which implements it, nor conveyor.h;
#  - examples/ and benchmarks/ build through conveyor::Pipeline and include
#    neither the runner, the runtime nor a transport;
#  - files short enough to read in one sitting: no source file over 400 lines.
# Usage: cmake -DSOURCE_DIR=<repository root> -P check_layout.cmake
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "check_layout.cmake: give -DSOURCE_DIR=<repository root>")
endif()
set(_patterns *.h *.cpp *.cu *.cuh)
set(_violations "")

# The includes of `folder`'s files that match `forbidden_regex`, as
# violations. `which`: ALL (the folder and below), HERE (the folder's own
# files) or HEADERS (the folder's own headers).
function(check_includes folder which forbidden_regex)
  set(_globs "")
  foreach(p IN LISTS _patterns)
    if(which STREQUAL "HEADERS" AND NOT p STREQUAL "*.h")
      continue()
    endif()
    list(APPEND _globs "${SOURCE_DIR}/${folder}/${p}")
  endforeach()
  if(which STREQUAL "ALL")
    file(GLOB_RECURSE _files ${_globs})
  else()
    file(GLOB _files ${_globs})
  endif()
  foreach(f IN LISTS _files)
    file(STRINGS "${f}" _includes REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
    foreach(line IN LISTS _includes)
      if(line MATCHES "${forbidden_regex}")
        file(RELATIVE_PATH _rel "${SOURCE_DIR}" "${f}")
        string(STRIP "${line}" line)
        list(APPEND _violations "${_rel}: ${line}")
      endif()
    endforeach()
  endforeach()
  set(_violations "${_violations}" PARENT_SCOPE)
endfunction()

set(_fronts "runner|script|export|distributed|checkpoint|measure|builder")
set(_root "\"plugin/(pipeline|conveyor)\\.h")
check_includes(schedules ALL "\"(ops|plugin)/")
check_includes(ops ALL "\"plugin/")
check_includes(plugin HEADERS "\"plugin/runtime/")
check_includes(plugin/core ALL "\"plugin/(model|trace|planner|transport|runtime|${_fronts})/|${_root}")
check_includes(plugin/support ALL "\"plugin/(core|model|trace|planner|transport|runtime|${_fronts})/|${_root}")
check_includes(plugin/model ALL
  "\"plugin/(runtime|planner|trace|transport|${_fronts})/|\"plugin/core/(options|option_[a-z]+|step_result)\\.h|${_root}")
check_includes(plugin/trace ALL "\"plugin/(runtime|planner|model|transport|${_fronts})/|\"plugin/core/(options|option_[a-z]+)\\.h|${_root}")
check_includes(plugin/planner ALL "\"plugin/(runtime|transport|${_fronts})/|${_root}")
check_includes(plugin/transport ALL "\"plugin/(runtime|planner|model|trace|${_fronts})/|\"plugin/core/options\\.h|${_root}")
check_includes(plugin/runtime ALL "\"plugin/(planner|trace|${_fronts})/|\"plugin/core/options\\.h|${_root}")
check_includes(plugin/runner ALL "\"plugin/(script|export|distributed|checkpoint|measure|builder)/|${_root}")
check_includes(plugin/runner HEADERS "\"plugin/runtime/")
foreach(front script export distributed checkpoint)
  check_includes(plugin/${front} ALL "\"plugin/(measure|builder)/|${_root}")
endforeach()
check_includes(plugin/measure ALL "\"plugin/(script|export|checkpoint|builder)/|${_root}")
check_includes(plugin/builder ALL "\"plugin/conveyor\\.h")
# Examples and benchmarks build through conveyor::Pipeline: never the runner,
# the runtime or a transport by themselves.
check_includes(examples ALL "\"plugin/(runner|runtime|transport)/")
check_includes(benchmarks ALL "\"plugin/(runner|runtime|transport)/")

# The installed headers include only installed headers.
if(EXISTS "${SOURCE_DIR}/cmake/public_headers.cmake")
  include("${SOURCE_DIR}/cmake/public_headers.cmake")
  foreach(header IN LISTS CONVEYOR_PUBLIC_HEADERS)
    file(STRINGS "${SOURCE_DIR}/${header}" _includes REGEX "^[ \t]*#[ \t]*include[ \t]*\"plugin/")
    foreach(line IN LISTS _includes)
      string(REGEX REPLACE "^[^\"]*\"([^\"]+)\".*" "\\1" _included "${line}")
      if(NOT _included IN_LIST CONVEYOR_PUBLIC_HEADERS)
        list(APPEND _violations "${header}: installed, but includes ${_included}, which is not (cmake/public_headers.cmake)")
      endif()
    endforeach()
  endforeach()
endif()

set(_long "")
foreach(folder plugin ops schedules examples benchmarks tests)
  set(_globs "")
  foreach(p IN LISTS _patterns ITEMS *.py)
    list(APPEND _globs "${SOURCE_DIR}/${folder}/${p}")
  endforeach()
  file(GLOB_RECURSE _files ${_globs})
  foreach(f IN LISTS _files)
    file(READ "${f}" _text)
    string(REGEX MATCHALL "\n" _newlines "${_text}")
    list(LENGTH _newlines _n)
    if(_n GREATER 400)
      file(RELATIVE_PATH _rel "${SOURCE_DIR}" "${f}")
      list(APPEND _long "${_rel}: ${_n} lines")
    endif()
  endforeach()
endforeach()

if(_violations OR _long)
  set(_message "")
  if(_violations)
    list(JOIN _violations "\n  " _text)
    string(APPEND _message "includes that reach up a layer:\n  ${_text}\n")
  endif()
  if(_long)
    list(JOIN _long "\n  " _text)
    string(APPEND _message "source files over 400 lines:\n  ${_text}\n")
  endif()
  message(FATAL_ERROR "${_message}")
endif()
message(STATUS "source layout: layers and plugin/'s folders point one way, no file over 400 lines")
