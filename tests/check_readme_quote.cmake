# The README quotes an example file whole and verbatim: fails when the two differ.
# Usage: cmake -DREADME=<README.md> -DEXAMPLE=<file> -P check_readme_quote.cmake
file(READ "${README}" _readme)
file(READ "${EXAMPLE}" _example)
string(FIND "${_readme}" "${_example}" _at)
if(_at EQUAL -1)
  message(FATAL_ERROR "README.md does not quote ${EXAMPLE} verbatim: paste it into its code block:\n${_example}")
endif()
message(STATUS "README.md quotes ${EXAMPLE} verbatim")
