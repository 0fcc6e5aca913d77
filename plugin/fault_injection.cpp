#include "plugin/fault_injection.h"

namespace conveyor {

namespace detail {
std::atomic<FaultInjector*> fault_injector{nullptr};
}  // namespace detail

void set_fault_injector(FaultInjector* injector) { detail::fault_injector.store(injector); }

}  // namespace conveyor
