# Finds what ebb builds against. `make deps` installs the Debian packages;
# a CUDA build points CMAKE_PREFIX_PATH or Torch_DIR at a CUDA libtorch.

find_package(Threads REQUIRED)
# zlib reads gzip-compressed IDX datasets (src/data.c)
find_package(ZLIB REQUIRED)

# libtorch: Debian's libtorch-dev (1.13) on CPU, or any libtorch 2.x, for
# example the one in a pip install:
#   cmake -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')"
find_package(Torch REQUIRED)
# TorchConfig finds libtorch.so and libc10.so with the system's folders first,
# so a pip libtorch on a machine that also has Debian's would link Debian's
# libc10 beside its own libtorch_cpu. Look again in its own folder only, then
# let TorchConfig build its lists from those.
set(EBB_TORCH_LIBDIR "${TORCH_INSTALL_PREFIX}/lib")
foreach(var c10_LIBRARY TORCH_LIBRARY)
  if(${var} AND NOT ${var} MATCHES "^${EBB_TORCH_LIBDIR}/")
    set(EBB_TORCH_REFIND ON)
  endif()
endforeach()
if(EBB_TORCH_REFIND)
  unset(c10_LIBRARY CACHE)
  unset(TORCH_LIBRARY CACHE)
  find_library(c10_LIBRARY c10 PATHS "${EBB_TORCH_LIBDIR}" NO_DEFAULT_PATH)
  find_library(TORCH_LIBRARY torch PATHS "${EBB_TORCH_LIBDIR}" NO_DEFAULT_PATH)
  find_package(Torch REQUIRED)
endif()
# TORCH_CXX_FLAGS carries the C++ ABI define; keep it off the C sources.
separate_arguments(EBB_TORCH_CXX_FLAGS UNIX_COMMAND "${TORCH_CXX_FLAGS}")

# CUDA paths compile only against a libtorch built with CUDA.
set(EBB_WITH_CUDA OFF)
if(TARGET torch_cuda OR TARGET c10_cuda OR TORCH_CUDA_LIBRARIES)
  set(EBB_WITH_CUDA ON)
endif()
message(STATUS "ebb: libtorch ${Torch_VERSION} at ${TORCH_INSTALL_PREFIX}, CUDA ${EBB_WITH_CUDA}")

# Data parallel on CUDA devices goes through libtorch's ProcessGroupNCCL,
# whose header includes NCCL's: pip's torch brings it in its nvidia-nccl
# wheel beside torch's folder, the CUDA toolkit in its include folder.
# Without it the build has no NCCL and a group on a GPU is refused.
set(EBB_NCCL_INCLUDE_DIR "")
if(EBB_WITH_CUDA)
  find_path(EBB_NCCL_INCLUDE_DIR_FOUND nccl.h
            HINTS "${TORCH_INSTALL_PREFIX}/../nvidia/nccl/include" ${CUDAToolkit_INCLUDE_DIRS}
                  /usr/local/cuda/include)
  if(EBB_NCCL_INCLUDE_DIR_FOUND)
    set(EBB_NCCL_INCLUDE_DIR "${EBB_NCCL_INCLUDE_DIR_FOUND}")
  endif()
  message(STATUS "ebb: NCCL's header: ${EBB_NCCL_INCLUDE_DIR_FOUND}")
endif()

# The process group (ops/tensor/dist.cpp) includes libtorch's c10d headers,
# which include Gloo's; neither Debian's libtorch-dev nor pip's torch ships
# them: Debian's libgloo-dev does (`make deps` installs it; on a machine
# without an archive, pack it: EXTRA_DEBS=libgloo-dev ../shared/device/pack-deps.sh).
find_path(EBB_GLOO_INCLUDE_DIR gloo/algorithm.h HINTS ${TORCH_INCLUDE_DIRS} ENV CPATH)
if(NOT EBB_GLOO_INCLUDE_DIR)
  message(FATAL_ERROR "ebb: Gloo's headers (gloo/algorithm.h), which libtorch's c10d headers "
                      "include, are not found in the compiler's paths, libtorch's include "
                      "folders or CPATH: install Debian's libgloo-dev (make deps does)")
endif()

# A python whose torch is the libtorch built against (`make TORCH=pip` sets
# the virtual environment's): tests then check the committed PyTorch fixtures
# against that torch too.
set(EBB_TORCH_PYTHON "" CACHE FILEPATH "python with the torch matching this libtorch (optional)")

# C libraries: pkg-config when present, else a plain search (the GPU machine
# carries unpacked Debian packages and may have no pkg-config). Each becomes
# an imported target ebb::<name>.
find_package(PkgConfig QUIET)
function(ebb_find_c_library name pkg header lib)
  if(TARGET ebb::${name})
    return()
  endif()
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(EBB_PC_${name} QUIET IMPORTED_TARGET ${pkg})
    # a .pc file of an unpacked package names folders under its /usr, not
    # where it was unpacked: trust it only when its folders exist
    set(usable ${EBB_PC_${name}_FOUND})
    foreach(dir IN LISTS EBB_PC_${name}_INCLUDE_DIRS)
      if(NOT EXISTS "${dir}")
        set(usable FALSE)
      endif()
    endforeach()
    if(usable)
      add_library(ebb::${name} INTERFACE IMPORTED GLOBAL)
      target_link_libraries(ebb::${name} INTERFACE PkgConfig::EBB_PC_${name})
      return()
    endif()
  endif()
  find_path(EBB_${name}_INCLUDE ${header})
  find_library(EBB_${name}_LIBRARY ${lib})
  if(NOT EBB_${name}_INCLUDE OR NOT EBB_${name}_LIBRARY)
    message(FATAL_ERROR "ebb: ${pkg} not found (Debian: run `make deps`, or install its -dev package)")
  endif()
  add_library(ebb::${name} UNKNOWN IMPORTED GLOBAL)
  set_target_properties(ebb::${name} PROPERTIES IMPORTED_LOCATION ${EBB_${name}_LIBRARY}
                        INTERFACE_INCLUDE_DIRECTORIES ${EBB_${name}_INCLUDE})
endfunction()

ebb_find_c_library(yaml yaml-0.1 yaml.h yaml)
ebb_find_c_library(cjson libcjson cjson/cJSON.h cjson)
if(EBB_BUILD_TESTS)
  ebb_find_c_library(cmocka cmocka cmocka.h cmocka)
endif()
