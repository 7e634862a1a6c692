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
else
  echo "pkg-config is not installed: skipped"
fi
