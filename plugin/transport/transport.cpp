#include "plugin/transport/transport.h"

namespace conveyor {

const char* channel_name(Channel channel) { return channel == Channel::kActivation ? "activation" : "gradient"; }

}  // namespace conveyor
