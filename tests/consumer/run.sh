#!/usr/bin/env bash
# Installs the build into a scratch prefix, then builds tests/consumer/main.c
# against it twice, with CMake's find_package(ebb) and with pkg-config, and
# runs both programs. Usage: run.sh BUILD_DIR SCRATCH_DIR
set -euo pipefail
build=$1
scratch=$2
here=$(cd "$(dirname "$0")" && pwd)
prefix=$scratch/prefix
rm -rf "$scratch"
mkdir -p "$scratch"

cmake --install "$build" --prefix "$prefix" >"$scratch/install.log"
for f in include/ebb/ebb.h lib/cmake/ebb/ebbConfig.cmake lib/cmake/ebb/ebbConfigVersion.cmake \
         lib/pkgconfig/ebb.pc share/doc/ebb/LICENSE bin/ebb; do
  [ -e "$prefix/$f" ] || { echo "install lacks $f"; exit 1; }
done

# The installed command runs from the prefix (its RPATH finds libebb).
"$prefix/bin/ebb" --version

echo "== find_package(ebb)"
cmake -S "$here" -B "$scratch/cmake" -DCMAKE_PREFIX_PATH="$prefix" >"$scratch/cmake.log"
cmake --build "$scratch/cmake" >"$scratch/cmake-build.log"
"$scratch/cmake/consumer"

echo "== pkg-config"
if command -v pkg-config >/dev/null; then
  export PKG_CONFIG_PATH="$prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  cc -std=c11 -Wall -Wextra -o "$scratch/consumer-pc" "$here/main.c" \
     $(pkg-config --cflags --libs ebb)
  "$scratch/consumer-pc"
  # the flags name ebb's headers and nothing of its private dependencies
  cflags=$(pkg-config --cflags ebb)
  set -- $cflags
  [ $# -eq 1 ] && [ "${1#-I}" != "$1" ] || { echo "pkg-config --cflags ebb gives '$cflags'"; exit 1; }
else
  echo "pkg-config is not installed: skipped"
fi

# The headers are clean C99 under -pedantic, and C++ (EBB_SHAPE included)
echo "== headers as C99 and C++"
printf '#include <ebb/ebb.h>\nint main(void) { ebb_shape s = EBB_SHAPE(2, 3); return (int)ebb_shape_numel(&s) - 6; }\n' \
  >"$scratch/pedantic.c"
cc -std=c99 -pedantic -Werror -Wall -Wextra -I"$prefix/include" -c "$scratch/pedantic.c" \
  -o "$scratch/pedantic.o"
if command -v c++ >/dev/null; then
  cp "$scratch/pedantic.c" "$scratch/pedantic.cpp"
  c++ -std=c++11 -pedantic -Werror -Wall -Wextra -I"$prefix/include" -c "$scratch/pedantic.cpp" \
    -o "$scratch/pedantic-cpp.o"
fi
echo "headers ok"
