#include "plugin/transport/transport.h"

#include <c10/util/Exception.h>

namespace conveyor {

const char* channel_name(Channel channel) { return channel == Channel::kActivation ? "activation" : "gradient"; }

at::Tensor Transport::sum_over_holders(int tie, const std::vector<int>&, const at::Tensor&) {
  TORCH_CHECK(false, "conveyor: tied parameter ", tie, " has holders in other processes, which this transport ",
              "cannot reach");
}

at::Tensor Transport::first_holders_value(int tie, const std::vector<int>& holders, const at::Tensor& tensor) {
  return sum_over_holders(tie, holders, tensor);
}

}  // namespace conveyor
