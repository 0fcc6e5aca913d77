#pragma once
// See gloo/context.h beside this file: held only through pointers.

namespace gloo::transport {

class Device;
class UnboundBuffer;

}  // namespace gloo::transport
