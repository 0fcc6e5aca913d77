#pragma once
// The TorchScript fixtures that tests/python/make_fixtures.py writes before
// the tests run (ctest passes their folder in CONVEYOR_FIXTURES).

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace conveyor::testing {

// The path of fixture `name`, or "" without CONVEYOR_FIXTURES.
inline std::string fixture(const std::string& name) {
  const char* dir = std::getenv("CONVEYOR_FIXTURES");
  return dir ? (std::filesystem::path(dir) / name).string() : std::string();
}

}  // namespace conveyor::testing

// Skips the test when the fixtures were not made (the binary run by hand).
#define REQUIRE_FIXTURES()                                                              \
  if (!std::getenv("CONVEYOR_FIXTURES")) {                                             \
    GTEST_SKIP() << "CONVEYOR_FIXTURES is not set (ctest runs make_fixtures.py first)"; \
  }
