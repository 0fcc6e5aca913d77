#pragma once
// Stands in for CUDA's <cooperative_groups.h> under the host emulation
// (../emulated_cuda.h): the grid group of a launch_cooperative() launch.
namespace cooperative_groups {
struct grid_group {
  void sync() const { ::emulated::grid_sync(); }
};
inline grid_group this_grid() { return {}; }
}  // namespace cooperative_groups
