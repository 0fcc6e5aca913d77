#pragma once
// What a call throws, for the tests that check error messages.

#include <exception>
#include <stdexcept>
#include <string>

namespace conveyor::testing {

// The message of the `Exception` that fn() throws, or "(no exception thrown)"
// when it returns normally; an exception of another type propagates (and
// fails the test that called it).
template <typename Exception = std::exception, typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Exception& e) {
    return e.what();
  }
  return "(no exception thrown)";
}

// The message of the std::invalid_argument that fn() throws: what bad input
// must raise.
template <typename Fn>
std::string invalid_argument_of(Fn&& fn) {
  return error_of<std::invalid_argument>(fn);
}

}  // namespace conveyor::testing
