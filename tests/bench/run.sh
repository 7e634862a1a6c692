#!/usr/bin/env bash
# `make bench`: runs the benchmark suite (tests/bench/run.py) against the
# ebb_bench built in BUILD (configured with -DEBB_BUILD_BENCH=ON) and prints
# one table. PyTorch eager runs on the torch that matches the libtorch built
# against: EBB_BENCH_PYTHON (`make bench TORCH=pip` sets the virtual
# environment's), else Debian's python3-torch at /usr/bin/python3, whatever
# `python3` is first on PATH.
#   bash tests/bench/run.sh [BUILD] [run.py options: --only mlp --config dispatch]
#   bash tests/bench/run.sh [BUILD] --only fashion    Fashion-MNIST epochs against PyTorch
#   bash tests/bench/run.sh [BUILD] --only remat      training under memory budgets
#   bash tests/bench/run.sh [BUILD] --only first_steps  the first 3 training steps' peaks
#                                                     against PyTorch (resnet_small, mnist_examples)
#   bash tests/bench/run.sh [BUILD] --only precision  training steps in bf16 against fp32 and
#                                                     PyTorch autocast (peaks, kept activations, time)
#   bash tests/bench/run.sh [BUILD] --only generate   generation through a key/value cache
#                                                     against PyTorch eager (tokens/s)
#   bash tests/bench/run.sh [BUILD] --clock cpu       tables on thread CPU time (busy machines)
#   python3 tests/bench/ddp.py --build BUILD [--nproc 2]  ebb train --nproc against PyTorch DDP
#                                                     (gloo), step time and per-rank peak
#   bash tests/bench/run.sh [BUILD] --no-compile      without torch.compile (PyTorch 2.x)
#   bash tests/bench/run.sh [BUILD] --device cuda     the training rows on a GPU (a CUDA
#                                                     libtorch and torch; forwards stay CPU-only)
# EBB_BENCH_THREADS sets the intra-op thread count of all engines (default 1);
# EBB_BENCH_CLOCK=cpu and EBB_BENCH_COMPILE=0 are the two flags above.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="${1:-build}"
shift || true
py="${EBB_BENCH_PYTHON:-/usr/bin/python3}"
if ! "$py" -c 'import torch' 2>/dev/null; then
  echo "ebb bench: $py cannot import torch; install Debian's python3-torch" >&2
  echo "  (sudo apt-get install -y --no-install-recommends python3-torch)," >&2
  echo "  or set EBB_BENCH_PYTHON to a python whose torch matches the build" >&2
  exit 1
fi
if [ ! -x "$build/tests/bench/ebb_bench" ]; then
  echo "ebb bench: $build/tests/bench/ebb_bench is missing; configure with -DEBB_BUILD_BENCH=ON" >&2
  exit 1
fi
exec "$py" "$here/run.py" --build "$build" "$@"
