#include "plugin/support/fault_injection.h"

#include <stdexcept>

namespace conveyor {

namespace detail {
std::atomic<FaultInjector*> fault_injector{nullptr};
}  // namespace detail

FaultInjectionScope::FaultInjectionScope(FaultInjector& injector) {
  FaultInjector* none = nullptr;
  if (!detail::fault_injector.compare_exchange_strong(none, &injector)) {
    throw std::logic_error("conveyor: a fault injector is installed already; end its FaultInjectionScope first");
  }
}

FaultInjectionScope::~FaultInjectionScope() { detail::fault_injector.store(nullptr); }

}  // namespace conveyor
