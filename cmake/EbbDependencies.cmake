# Finds what ebb builds against. `make deps` installs the Debian packages;
# a CUDA build points CMAKE_PREFIX_PATH or Torch_DIR at a CUDA libtorch.

find_package(Threads REQUIRED)

# libtorch: Debian's libtorch-dev (1.13) on CPU, or any libtorch 2.x, for
# example the one in a pip install:
#   cmake -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')"
find_package(Torch REQUIRED)
# TORCH_CXX_FLAGS carries the C++ ABI define; keep it off the C sources.
separate_arguments(EBB_TORCH_CXX_FLAGS UNIX_COMMAND "${TORCH_CXX_FLAGS}")

set(EBB_WITH_CUDA OFF)
if(TARGET torch_cuda OR TARGET c10_cuda OR CUDA_FOUND OR CUDAToolkit_FOUND)
  set(EBB_WITH_CUDA ON)
endif()
message(STATUS "ebb: libtorch ${Torch_VERSION} at ${TORCH_INSTALL_PREFIX}, CUDA ${EBB_WITH_CUDA}")

find_package(PkgConfig REQUIRED)
pkg_check_modules(YAML REQUIRED IMPORTED_TARGET yaml-0.1)
pkg_check_modules(CJSON REQUIRED IMPORTED_TARGET libcjson)
if(EBB_BUILD_TESTS)
  pkg_check_modules(CMOCKA REQUIRED IMPORTED_TARGET cmocka)
endif()
