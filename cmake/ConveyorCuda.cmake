# Decides whether the CUDA sources are built (CONVEYOR_WITH_CUDA) before
# find_package(Torch), so that a CUDA LibTorch finds the same toolkit we compile
# with, and so that CONVEYOR_CUDA=ON without a toolkit fails here, with a message
# that says what is missing, instead of deep inside Torch's own config.

set(CONVEYOR_CUDA AUTO CACHE STRING "Build the CUDA kernels: AUTO (when nvcc is found), ON (required) or OFF")
set_property(CACHE CONVEYOR_CUDA PROPERTY STRINGS AUTO ON OFF)
string(TOUPPER "${CONVEYOR_CUDA}" _conveyor_cuda_mode)
if(NOT _conveyor_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "CONVEYOR_CUDA must be AUTO, ON or OFF (got '${CONVEYOR_CUDA}')")
endif()

set(CONVEYOR_WITH_CUDA OFF)
set(_conveyor_have_toolkit OFF)
# Look for nvcc in every mode: with CONVEYOR_CUDA=OFF no kernel is built, but a
# CUDA LibTorch's own CMake config still needs the toolkit's headers and cudart.
include(CheckLanguage)
# /usr/local/bin/nvcc is often a wrapper script: prefer the toolkit's own
# binary so CMake can derive the toolkit root from it.
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
  find_program(_conveyor_nvcc nvcc
    HINTS "$ENV{CUDA_HOME}/bin" "$ENV{CUDA_PATH}/bin" /usr/local/cuda/bin
    NO_CACHE)
  if(_conveyor_nvcc)
    set(CMAKE_CUDA_COMPILER "${_conveyor_nvcc}")
  endif()
endif()
if(NOT _conveyor_cuda_mode STREQUAL "OFF")
  check_language(CUDA)
endif()
# A compiler named on the command line is not checked by check_language.
if(CMAKE_CUDA_COMPILER AND NOT EXISTS "${CMAKE_CUDA_COMPILER}")
  find_program(_conveyor_named_nvcc "${CMAKE_CUDA_COMPILER}" NO_CACHE)
  if(NOT _conveyor_named_nvcc)
    unset(CMAKE_CUDA_COMPILER)
    unset(CMAKE_CUDA_COMPILER CACHE)
  endif()
endif()
if(CMAKE_CUDA_COMPILER)
  set(_conveyor_have_toolkit ON)
  if(NOT _conveyor_cuda_mode STREQUAL "OFF")
    set(CONVEYOR_WITH_CUDA ON)
  endif()
elseif(_conveyor_cuda_mode STREQUAL "ON")
  message(FATAL_ERROR
    "CONVEYOR_CUDA=ON but no working CUDA compiler (nvcc) was found. "
    "Install the CUDA toolkit, point CMAKE_CUDA_COMPILER or CUDA_HOME at it, "
    "or configure with -DCONVEYOR_CUDA=OFF (or AUTO) to build the CPU paths only "
    "(with a CUDA LibTorch, whose own CMake config needs the toolkit, OFF still needs one: "
    "use a CPU LibTorch, e.g. CONVEYOR_TORCH_VERSION=2.13.0, where there is none).")
elseif(NOT _conveyor_cuda_mode STREQUAL "OFF")
  message(STATUS "conveyor: no nvcc found, building without CUDA kernels")
endif()

# A CUDA LibTorch's config needs the toolkit even when no kernel is built: say
# so before it fails with a message that does not name the cause.
# Torch_DIR when given, else the prefixes find_package(Torch) will search
# (under pip install ., the environment's torch: cmake/TorchFromPython.cmake).
find_file(_conveyor_caffe2_config Caffe2Config.cmake HINTS "${Torch_DIR}/../Caffe2" ${CMAKE_PREFIX_PATH}
  PATH_SUFFIXES Caffe2 share/cmake/Caffe2 NO_CACHE)
if(_conveyor_caffe2_config AND NOT _conveyor_have_toolkit)
  file(STRINGS "${_conveyor_caffe2_config}" _conveyor_uses_cuda REGEX "set\\(CAFFE2_USE_CUDA (1|ON)\\)")  # 2.11 writes ON
  if(_conveyor_uses_cuda)
    message(FATAL_ERROR
      "The LibTorch found (${_conveyor_caffe2_config}) is a CUDA build, and its CMake config needs "
      "a CUDA toolkit (nvcc, headers, cudart) even with CONVEYOR_CUDA=OFF. Install the toolkit or point "
      "CUDA_HOME at it, or build against a CPU LibTorch (scripts/setup.sh: CONVEYOR_TORCH_VERSION=2.13.0).")
  endif()
endif()

if(_conveyor_have_toolkit)
  # Default to Hopper (sm_90); honour TORCH_CUDA_ARCH_LIST but keep sm_90 in it.
  if(NOT DEFINED TORCH_CUDA_ARCH_LIST)
    if(DEFINED ENV{TORCH_CUDA_ARCH_LIST})
      set(TORCH_CUDA_ARCH_LIST "$ENV{TORCH_CUDA_ARCH_LIST}")
    else()
      set(TORCH_CUDA_ARCH_LIST "9.0")
    endif()
  endif()
  string(REPLACE " " ";" TORCH_CUDA_ARCH_LIST "${TORCH_CUDA_ARCH_LIST}")
  if(NOT "9.0" IN_LIST TORCH_CUDA_ARCH_LIST)
    list(APPEND TORCH_CUDA_ARCH_LIST "9.0")
  endif()
  set(ENV{TORCH_CUDA_ARCH_LIST} "${TORCH_CUDA_ARCH_LIST}")
  if(CONVEYOR_WITH_CUDA)
    enable_language(CUDA)
  endif()
  if(NOT CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT})
    get_filename_component(CUDAToolkit_ROOT "${CMAKE_CUDA_COMPILER}/../.." ABSOLUTE)  # without the CUDA language
  endif()
  find_package(CUDAToolkit REQUIRED)
  # Torch's config uses the legacy FindCUDA variables.
  if(NOT CUDA_TOOLKIT_ROOT_DIR)
    get_filename_component(CUDA_TOOLKIT_ROOT_DIR "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  endif()
  # Pip wheels carry nvrtc in site-packages/nvidia/cu*/lib while a bare toolkit
  # may not: look beside the Torch that CMAKE_PREFIX_PATH points at.
  find_path(_conveyor_torch_cfg TorchConfig.cmake HINTS "${Torch_DIR}" ${CMAKE_PREFIX_PATH}
    PATH_SUFFIXES Torch share/cmake/Torch NO_CACHE)
  set(_conveyor_lib_hints "${CUDAToolkit_LIBRARY_DIR}")
  if(_conveyor_torch_cfg)
    get_filename_component(_site "${_conveyor_torch_cfg}/../../../.." ABSOLUTE)
    file(GLOB _wheel_dirs "${_site}/nvidia/cu*/lib" "${_site}/nvidia/cuda_nvrtc/lib")
    list(APPEND _conveyor_lib_hints ${_wheel_dirs})
  endif()
  # A CUDA LibTorch includes cuBLAS/cuSPARSE/cuDNN headers that a bare toolkit
  # (nvcc and cudart only) lacks; the pip wheels beside torch carry them. Link
  # in just the missing ones, so the toolkit's own headers keep precedence.
  set(CONVEYOR_CUDA_EXTRA_INCLUDE "${CMAKE_BINARY_DIR}/cuda-extra-include")
  file(MAKE_DIRECTORY "${CONVEYOR_CUDA_EXTRA_INCLUDE}")
  if(_conveyor_torch_cfg)
    file(GLOB _wheel_headers "${_site}/nvidia/*/include/*.h")
    foreach(_h IN LISTS _wheel_headers)
      get_filename_component(_name "${_h}" NAME)
      set(_found OFF)
      foreach(_dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
        if(EXISTS "${_dir}/${_name}")
          set(_found ON)
        endif()
      endforeach()
      if(NOT _found AND NOT EXISTS "${CONVEYOR_CUDA_EXTRA_INCLUDE}/${_name}")
        file(CREATE_LINK "${_h}" "${CONVEYOR_CUDA_EXTRA_INCLUDE}/${_name}" SYMBOLIC)
      endif()
    endforeach()
  endif()
  find_library(CUDA_nvrtc_LIBRARY NAMES nvrtc libnvrtc.so.13 libnvrtc.so.12 HINTS ${_conveyor_lib_hints})
  if(NOT CUDA_nvrtc_LIBRARY)
    message(FATAL_ERROR "conveyor: a CUDA LibTorch links NVRTC, and none was found in the toolkit "
      "(${CUDAToolkit_LIBRARY_DIR}) or beside torch (${_conveyor_lib_hints}). Install the toolkit's nvrtc or the "
      "nvidia-cuda-nvrtc wheel, or name it with -DCUDA_nvrtc_LIBRARY=/path/to/libnvrtc.so.")
  endif()
  if(CONVEYOR_WITH_CUDA)
    message(STATUS "conveyor: CUDA kernels ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, arch list ${TORCH_CUDA_ARCH_LIST})")
  else()
    message(STATUS "conveyor: CONVEYOR_CUDA=OFF: no CUDA kernels (the toolkit at ${CUDAToolkit_BIN_DIR} serves LibTorch's config)")
  endif()
endif()
