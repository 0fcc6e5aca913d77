#pragma once
// Declarations of the Gloo names that LibTorch's ProcessGroupGloo.hpp uses,
// for LibTorch builds (the pip wheels) that ship that header but not Gloo's.
// Only plugin/distributed/gloo_group.cpp sees them; see the comment there.

#include <chrono>

namespace gloo {

class Context {
 public:
  // Defined in libtorch_cpu (the inline ProcessGroupGloo::setTimeout calls it).
  void setTimeout(std::chrono::milliseconds timeout);
};

}  // namespace gloo
