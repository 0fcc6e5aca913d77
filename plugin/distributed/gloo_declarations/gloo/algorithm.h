#pragma once
// See gloo/context.h beside this file: ProcessGroupGloo.hpp includes this
// header but uses nothing from it.
