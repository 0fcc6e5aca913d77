# The shared libstdc++ that the library, and every program that links it, must
# use: the one torch's own libraries load.
#
# Two ways a build gets this wrong, both seen:
#  - torch 2.11's libtorch.so exports copies of libstdc++'s std::filesystem
#    functions (remove_all, rename, permissions, ...) that crash when another
#    library calls them, and a program whose libraries list libtorch before
#    libstdc++ binds every such call to them. So libstdc++ comes first, also in
#    consumers (a PUBLIC link option), with --no-as-needed.
#  - A relocated GCC whose own library folder holds only libstdc++.a (the GPU
#    machines' /opt/gcc) resolves "-lstdc++" to the archive: a second, static
#    libstdc++ inside libconveyor.so, beside torch's shared one, whose iostreams
#    crash at the first formatted double (import conveyor died in
#    every_option()). Naming the shared library by its path cannot resolve to
#    an archive; once it is on the link line no archive member is pulled in.
#
# conveyor_shared_libstdcxx(<var>) sets <var> to the path of that shared
# library: the compiler's own (-print-file-name) where it has one, else the
# system's libstdc++.so.6; CONVEYOR_LIBSTDCXX (cache) overrides both. For GCC
# only (the top-level CMakeLists calls it there); stops the configure when no
# shared libstdc++ is found.
function(conveyor_shared_libstdcxx out)
  if(CONVEYOR_LIBSTDCXX)
    set(${out} "${CONVEYOR_LIBSTDCXX}" PARENT_SCOPE)
    return()
  endif()
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so
    OUTPUT_VARIABLE _compiler_own OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
  if(_rc EQUAL 0 AND IS_ABSOLUTE "${_compiler_own}" AND EXISTS "${_compiler_own}")
    set(_found "${_compiler_own}")
  else()
    find_library(_conveyor_system_libstdcxx NAMES libstdc++.so.6 libstdc++.so)
    set(_found "${_conveyor_system_libstdcxx}")
  endif()
  if(NOT _found)
    message(FATAL_ERROR "conveyor: no shared libstdc++ found (neither '${CMAKE_CXX_COMPILER} "
      "-print-file-name=libstdc++.so' nor the system's libstdc++.so.6). Torch loads the shared one; a "
      "static copy in libconveyor crashes. Name it: -DCONVEYOR_LIBSTDCXX=/path/to/libstdc++.so.6")
  endif()
  file(REAL_PATH "${_found}" _found)
  set(CONVEYOR_LIBSTDCXX "${_found}" CACHE FILEPATH "The shared libstdc++ that libconveyor links (torch's)")
  set(${out} "${_found}" PARENT_SCOPE)
endfunction()
