# The README quotes examples/minimal.cpp verbatim: fails when the two differ.
# Usage: cmake -DREADME=<README.md> -DEXAMPLE=<examples/minimal.cpp> -P check_readme_quote.cmake
file(READ "${README}" _readme)
file(READ "${EXAMPLE}" _example)
string(FIND "${_readme}" "${_example}" _at)
if(_at EQUAL -1)
  message(FATAL_ERROR "README.md does not quote ${EXAMPLE} verbatim: paste the file into its C++ block")
endif()
message(STATUS "README.md quotes ${EXAMPLE} verbatim")
