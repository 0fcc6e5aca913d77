#pragma once
// The library's version. CMakeLists.txt reads the project's version from
// these lines, so they are the one place it is written.

#define CONVEYOR_VERSION_MAJOR 0
#define CONVEYOR_VERSION_MINOR 2
#define CONVEYOR_VERSION_PATCH 0

// MAJOR * 10000 + MINOR * 100 + PATCH, for #if comparisons.
#define CONVEYOR_VERSION_NUMBER (CONVEYOR_VERSION_MAJOR * 10000 + CONVEYOR_VERSION_MINOR * 100 + CONVEYOR_VERSION_PATCH)

#define CONVEYOR_VERSION_TEXT_(x) #x
#define CONVEYOR_VERSION_TEXT(x) CONVEYOR_VERSION_TEXT_(x)
// "MAJOR.MINOR.PATCH"
#define CONVEYOR_VERSION                                                               \
  CONVEYOR_VERSION_TEXT(CONVEYOR_VERSION_MAJOR) "." CONVEYOR_VERSION_TEXT(CONVEYOR_VERSION_MINOR) "." \
      CONVEYOR_VERSION_TEXT(CONVEYOR_VERSION_PATCH)
