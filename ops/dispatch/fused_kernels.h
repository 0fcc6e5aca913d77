#pragma once
// What fused_dispatch.cpp asks of the kernel overrides (fused_kernels.cpp).

#include <cstdint>

namespace conveyor {

// Changes whenever an override does (part of dispatch_generation()).
uint64_t kernel_overrides_generation();
// Forgets the overrides: the next use reads CONVEYOR_FUSED_KERNEL again.
void forget_kernel_overrides();

}  // namespace conveyor
