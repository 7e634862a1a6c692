#!/usr/bin/env bash
# `make gpu-check`: what a machine with an NVIDIA GPU and a CUDA libtorch can
# tell us, in one command that stays within 10 minutes (EBB_GPU_BUDGET):
#
#   build  configure and compile a Release build of its own (BUILD) against the
#          CUDA libtorch; refuses a libtorch without CUDA
#   test   ctest, the device-aware suites on the GPU (EBB_TEST_DEVICE=cuda)
#   peaks  every spec in specs/bench/ at the bench's sizes, and a training step
#          (ebb grad, ebb train; ebb train under --memory-budget least and with
#          --precision bf16), run on the GPU with --trace: the planned peak,
#          rounded as the CUDA caching allocator rounds its blocks, against the
#          measured one
#   bench  forward times: ebb eager, ebb's CUDA-graph replay (--cuda-graph), the
#          libtorch C++ twin and PyTorch eager (tests/bench's models and sizes)
#   train  training steps (forward, loss, backward, AdamW) on the GPU: ebb's
#          training plan, its libtorch C++ twin and PyTorch eager, side by side
#          in one run of tests/bench/run.py --device cuda (its training rows),
#          with their peaks; target ebb <= 0.85 x PyTorch eager, dispatch-bound
#
# then one short table, last. Every command's output is kept under RESULTS.
#
#   bash tests/gpu/run.sh [--dry-run] [--build DIR] [--skip-build] [--only STEP]
#                         [--results DIR]
#
# --dry-run configures and compiles the same Release build on any machine, a
# machine without a GPU included, then lists the commands the other steps would
# run, and touches no GPU. The exit status is 0 when every step passed.
#
# Environment:
#   EBB_TORCH_PREFIX  the CUDA libtorch: its CMake prefix (.../torch/share/cmake)
#                     or its root (.../libtorch); else the CMake prefix of the torch
#                     that EBB_TORCH_PYTHON (default python3) imports
#   EBB_TORCH_PYTHON  the python whose torch is that libtorch; it also runs the
#                     PyTorch side of the bench
#   JOBS              parallel jobs of the build and ctest (default: nproc)
#   EBB_GPU_BUDGET    seconds the whole run may take (default 570; a dry run 3600)
#   EBB_GPU_CHECK_DEVICE  cuda (default), or cpu to try the steps of this script
#                     on a machine without a GPU (the results are then no GPU check)
#   EBB_GPU_TRAIN_TIMEOUT  seconds the train step may take at most (default 240)
#   OUT               set by the device tool: the table and an archive of the
#                     logs (gpu-check-table.txt, gpu-check-logs.tgz) go there
# On the GPU machine of ../shared/device, .device/unpack.sh, when present, is
# sourced first: it provides libyaml, cJSON and cmocka, and Gloo's headers and
# Fashion-MNIST when packed with
# EXTRA_DEBS="dataset-fashion-mnist libgloo-dev" bash ../shared/device/pack-deps.sh
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
}

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"

build="build-gpu"
results=""
dry_run=0
skip_build=0
only=""
steps=(build test peaks bench train)
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --skip-build) skip_build=1 ;;
    --build|--only|--results)
      [ $# -ge 2 ] || { echo "gpu-check: $1 needs a value (see --help)" >&2; exit 2; }
      case "$1" in
        --build) build=$2 ;;
        --only) only=$2 ;;
        --results) results=$2 ;;
      esac
      shift ;;
    --build=*) build=${1#*=} ;;
    --only=*) only=${1#*=} ;;
    --results=*) results=${1#*=} ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ -n "$only" ]; then
  case " ${steps[*]} " in
    *" $only "*) steps=("$only") ;;
    *) echo "gpu-check: --only $only: the steps are build, test, peaks, bench, train" >&2; exit 2 ;;
  esac
fi
if (( skip_build )); then
  steps=("${steps[@]/build}")
fi

device=${EBB_GPU_CHECK_DEVICE:-cuda}
jobs=${JOBS:-$(nproc)}
# the GPU machine's 10 minutes; a dry run may compile on a slower machine
if (( dry_run )); then budget=${EBB_GPU_BUDGET:-3600}; else budget=${EBB_GPU_BUDGET:-570}; fi
# The device tool brings back at most 8 files from $OUT, two folders deep:
# there the logs go to $build/gpu-check and $OUT gets the table and one
# archive of every log (traces and weights left out: tens of MB)
results=${results:-$build/gpu-check}
ebb="$build/ebb"
mkdir -p "$results"
summary=$results/summary.tsv
: >"$summary"
: >"$results/commands.txt"
failures=0
# what the peaks and bench steps leave for the train step, when it runs
case " ${steps[*]} " in *" train "*) train_reserve=90 ;; *) train_reserve=0 ;; esac

say() { printf 'gpu-check: %s\n' "$*" >&2; }
die() { printf 'gpu-check: error: %s\n' "$*" >&2; exit 1; }
# record KIND FIELD...: one line of the summary that the table is drawn from
record() { (IFS=$'\t'; printf '%s\n' "$*") >>"$summary"; }
fail_step() { failures=$((failures + 1)); record step "$1" FAILED "$2"; say "$1: FAILED: $2"; }

# ---- the time budget: every command runs under a limit taken from what is left

# limit CAP RESERVE: the seconds a command may take: CAP at most, leaving
# RESERVE for the steps after it. Fails when less than 10 s would remain.
# The peaks and bench steps leave train_reserve besides for the train step.
limit() {
  local left=$((budget - SECONDS - $2))
  local n=$(( left < $1 ? left : $1 ))
  if (( n < 10 )); then return 1; fi
  echo "$n"
}

# execute STEP LOG LIMIT CMD...: runs CMD under `timeout LIMIT`, its output
# (stdout and stderr) in LOG, the command in commands.txt. Returns CMD's
# status; 124 or 137 mean it ran out of time.
execute() {
  local step=$1 log=$2 lim=$3
  shift 3
  printf '[%s] %s> %s\n' "$step" "$(printf '%q ' timeout -k 5 "$lim" "$@")" "$log" \
    >>"$results/commands.txt"
  timeout -k 5 "$lim" "$@" >"$log" 2>&1
}

# run STEP LOG LIMIT CMD...: execute, or in a dry run list the command instead.
run() {
  if (( dry_run )); then
    printf '  [%s] %s> %s\n' "$1" "$(printf '%q ' timeout -k 5 "$3" "${@:4}")" "$2" \
      | tee -a "$results/commands.txt"
    return 0
  fi
  execute "$@"
}

# why LOG: the line that says what went wrong: ebb's own error (`ebb: ...`, not
# a note or a warning), else one that says error, else the last
why() {
  local line
  line=$(grep -v -E '^ebb: (note|warning):' "$1" 2>/dev/null | grep -m1 -E '^(ebb: |gpu_check.py: )' || true)
  [ -n "$line" ] || line=$(grep -m1 -i 'error' "$1" 2>/dev/null || true)
  [ -n "$line" ] || line=$(tail -n 1 "$1" 2>/dev/null || true)
  printf '%s' "${line:-no output}" | tr '\t' ' ' | cut -c1-200
}

timed_out() { [ "$1" -eq 124 ] || [ "$1" -eq 137 ]; }

# ---- preconditions: a GPU, the packages the device machine carries, a CUDA libtorch

gpu_name=""
if (( ! dry_run )) && [ "$device" = cuda ]; then
  if command -v nvidia-smi >/dev/null; then
    gpu_name=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 \
               | head -n 1) || die "no CUDA device: nvidia-smi fails: $gpu_name"
    [ -n "$gpu_name" ] || die "no CUDA device: nvidia-smi lists no GPU"
  elif [ ! -e /dev/nvidia0 ]; then
    die "no CUDA device: nvidia-smi is not installed and /dev/nvidia0 does not exist, so this" \
        "machine has no NVIDIA GPU. \`bash tests/gpu/run.sh --dry-run\` (make gpu-check" \
        "GPU_CHECK_FLAGS=--dry-run) configures, compiles and lists the commands without one."
  fi
fi
if [ "$device" != cuda ]; then
  say "EBB_GPU_CHECK_DEVICE=$device: the steps run on $device; this tests the script, it checks no GPU"
fi
command -v timeout >/dev/null || die "coreutils' timeout is missing; it keeps each step within the budget"

if [ -f .device/unpack.sh ]; then
  say "sourcing .device/unpack.sh (libyaml, cJSON, cmocka for this machine)"
  # shellcheck disable=SC1091
  source .device/unpack.sh >&2 || die ".device/unpack.sh failed; repack it with ../shared/device/pack-deps.sh"
  # zlib1g-dev's libz.so links to zlib1g's libz.so.1, which is not packed: a
  # dangling link makes the link step take libz.a, which is not -fPIC. Point
  # it at the machine's own libz.so.1.
  z=$EBB_DEVICE_PREFIX/usr/lib/x86_64-linux-gnu/libz.so
  if [ -L "$z" ] && [ ! -e "$z" ]; then
    for s in /lib/x86_64-linux-gnu/libz.so.1 /usr/lib/x86_64-linux-gnu/libz.so.1 /usr/lib64/libz.so.1; do
      if [ -e "$s" ]; then ln -sf "$s" "$z"; break; fi
    done
  fi
  # pkg-config and the linker find the unpacked libraries too (the install
  # test builds a program with `pkg-config --libs ebb`); their .pc files name
  # /usr, so the linker's search path carries the unpacked folder
  multiarch=$EBB_DEVICE_PREFIX/usr/lib/x86_64-linux-gnu
  export PKG_CONFIG_PATH="$multiarch/pkgconfig:$EBB_DEVICE_PREFIX/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export LIBRARY_PATH="$multiarch${LIBRARY_PATH:+:$LIBRARY_PATH}"
  # Fashion-MNIST, when packed (EXTRA_DEBS=dataset-fashion-mnist), where the
  # library and the tests look for it; the GPU machine is a bare one of our own
  fm=$EBB_DEVICE_PREFIX/usr/share/datasets/fashion-mnist
  if [ -d "$fm" ] && [ ! -e /usr/share/datasets/fashion-mnist ] && [ -w /usr/share ]; then
    mkdir -p /usr/share/datasets && ln -s "$fm" /usr/share/datasets/fashion-mnist
  fi
  # CMake splits the CMAKE_PREFIX_PATH environment variable at ':' on Unix, not at ';'
  export CMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH//;/:}"
fi

torch_py=${EBB_TORCH_PYTHON:-python3}
if [ -n "${EBB_TORCH_PREFIX:-}" ]; then
  if [ -f "$EBB_TORCH_PREFIX/Torch/TorchConfig.cmake" ]; then
    torch_prefix=$EBB_TORCH_PREFIX
  elif [ -f "$EBB_TORCH_PREFIX/share/cmake/Torch/TorchConfig.cmake" ]; then
    torch_prefix=$EBB_TORCH_PREFIX/share/cmake
  else
    die "EBB_TORCH_PREFIX=$EBB_TORCH_PREFIX holds no Torch/TorchConfig.cmake nor share/cmake/Torch/TorchConfig.cmake"
  fi
else
  command -v "$torch_py" >/dev/null || die "no libtorch: $torch_py is not installed; set EBB_TORCH_PYTHON to a python with a CUDA torch, or EBB_TORCH_PREFIX to a CUDA libtorch"
  torch_prefix=$("$torch_py" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null) \
    || die "no libtorch: $torch_py cannot import torch; set EBB_TORCH_PYTHON to a python with a CUDA torch, or EBB_TORCH_PREFIX to a CUDA libtorch"
fi
[ -f "$torch_prefix/Torch/TorchConfig.cmake" ] \
  || die "no libtorch: $torch_prefix/Torch/TorchConfig.cmake does not exist (a torch without its C++ library?); set EBB_TORCH_PREFIX to a CUDA libtorch"
# a libtorch's libraries are in <root>/lib, its CMake files in <root>/share/cmake; the
# configure says for certain ("CUDA ON"), this says it before compiling anything
torch_lib=$torch_prefix/../../lib
if [ -f "$torch_lib/libtorch.so" ] && [ ! -f "$torch_lib/libtorch_cuda.so" ]; then
  die "the libtorch in $(cd "$torch_lib" && pwd) has no CUDA (no libtorch_cuda.so): install a torch built with CUDA, or point EBB_TORCH_PREFIX at one"
fi
# the python that runs the helpers (standard library only) and PyTorch eager
if command -v "$torch_py" >/dev/null; then helper_py=$torch_py; else helper_py=python3; fi
command -v "$helper_py" >/dev/null || die "no python3: the peaks and bench steps read their traces with it"
say "libtorch: $torch_prefix; build: $build; results: $results; budget ${budget} s"

# ---- build -----------------------------------------------------------------

step_build() {
  command -v cmake >/dev/null || die "cmake is not installed"
  local gen=() lim t0=$SECONDS
  # a folder configured before keeps its generator
  if [ ! -f "$build/CMakeCache.txt" ] && command -v ninja >/dev/null; then gen=(-G Ninja); fi
  local cfg=(cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release
             "-DCMAKE_PREFIX_PATH=$torch_prefix${EBB_DEVICE_PREFIX:+;$EBB_DEVICE_PREFIX/usr}"
             "-DTorch_DIR=$torch_prefix/Torch" -DEBB_BUILD_TESTS=ON -DEBB_BUILD_EXAMPLES=ON
             -DEBB_BUILD_BENCH=ON)
  # the unpacked Debian packages keep their libraries in the multiarch folder,
  # which CMake searches only where it knows the machine's multiarch triplet
  if [ -n "${EBB_DEVICE_PREFIX:-}" ]; then
    cfg+=("-DCMAKE_LIBRARY_PATH=$EBB_DEVICE_PREFIX/usr/lib/x86_64-linux-gnu"
          "-DCMAKE_INCLUDE_PATH=$EBB_DEVICE_PREFIX/usr/include")
  fi
  if command -v "$torch_py" >/dev/null; then cfg+=("-DEBB_TORCH_PYTHON=$(command -v "$torch_py")"); fi
  lim=$(limit 300 150) || { fail_step build "no time left to configure"; return 1; }
  say "build: configuring (log: $results/configure.log)"
  if ! execute build "$results/configure.log" "$lim" "${cfg[@]}"; then
    tail -n 20 "$results/configure.log" >&2
    fail_step build "cmake failed to configure: $(why "$results/configure.log") (configure.log)"
    return 1
  fi
  if ! grep -q 'ebb: libtorch .*, CUDA ON' "$results/configure.log"; then
    fail_step build "the configure found a libtorch without CUDA: $(grep 'ebb: libtorch' "$results/configure.log" || echo '?') (configure.log)"
    return 1
  fi
  local t1=$SECONDS
  lim=$(limit 420 150) || { fail_step build "no time left to compile"; return 1; }
  say "build: compiling with $jobs jobs (log: $results/build.log)"
  if ! execute build "$results/build.log" "$lim" cmake --build "$build" -j "$jobs"; then
    grep -E 'error|Error' "$results/build.log" | head -n 20 >&2 || tail -n 20 "$results/build.log" >&2
    fail_step build "the build failed: $(why "$results/build.log") (build.log)"
    return 1
  fi
  record step build ok "Release, configure $((t1 - t0)) s, compile $((SECONDS - t1)) s ($jobs jobs)"
  check_binary_once
}

# The built command, and on a real run a device it can use. A dry run hides
# every GPU from it (CUDA_VISIBLE_DEVICES=) and only asks that CUDA be compiled in.
check_binary() {
  [ -x "$ebb" ] || die "$ebb is missing: build first (drop --skip-build, or --only build)"
  local hide=()
  if (( dry_run )); then hide=(env CUDA_VISIBLE_DEVICES=); fi
  version=$("${hide[@]}" "$ebb" --version 2>&1) || die "$ebb --version failed: $version"
  case "$version" in
    *"CUDA compiled in"*) ;;
    *) die "$ebb was built without CUDA: $version" ;;
  esac
  if (( ! dry_run )) && [ "$device" = cuda ]; then
    case "$version" in
      *"a device is available"*) ;;
      *) die "no CUDA device: $ebb --version says '$version' (libtorch sees no usable GPU: driver, CUDA_VISIBLE_DEVICES?)" ;;
    esac
  fi
  say "$version"
}

# ---- test ------------------------------------------------------------------

step_test() {
  command -v ctest >/dev/null || { fail_step test "ctest is not installed"; return; }
  [ -f "$build/CTestTestfile.cmake" ] || { fail_step test "$build has no tests: configure it first (drop --skip-build)"; return; }
  check_binary_once
  local log=$results/ctest.log lim rc=0
  local cmd=(env "EBB_TEST_DEVICE=$device" ctest --test-dir "$build")
  # ctest before 3.20 has no --test-dir: run it inside the build folder
  [[ "$(ctest --help 2>/dev/null)" == *--test-dir* ]] || cmd=(env -C "$build" "EBB_TEST_DEVICE=$device" ctest)
  # what the steps after it need, when they run (--only test: nothing)
  local after=0
  case " ${steps[*]} " in *" peaks "*|*" bench "*|*" train "*) after=150 ;; esac
  lim=$(limit "${EBB_GPU_CTEST_TIMEOUT:-240}" "$after") || { fail_step test "no time left for ctest"; return; }
  say "test: ctest on $device, at most $lim s (log: $log)"
  run test "$log" "$lim" "${cmd[@]}" --output-on-failure -j "$jobs" || rc=$?
  (( dry_run )) && return
  local tally failed
  tally=$(grep -E 'tests passed, [0-9]+ tests? failed out of' "$log" | tail -n 1 || true)
  failed=$(sed -n '/The following tests FAILED:/,$p' "$log" | sed -n 's/^[[:space:]]*[0-9]* - \([^ ]*\).*/\1/p' \
           | paste -sd, - || true)
  if timed_out "$rc"; then
    fail_step test "ctest ran out of its $lim s${failed:+; failed before that: $failed} (ctest.log)"
  elif [ "$rc" -ne 0 ]; then
    fail_step test "${tally:-ctest exited $rc}${failed:+: $failed} (ctest.log)"
  else
    record step test ok "$tally"
  fi
}

# ---- the bench's workloads --------------------------------------------------

# One line per workload and size: tests/bench/run.py's SUITE (workload, config,
# params, binds, fills), then any spec of specs/bench/ it lacks, at the spec's
# own sizes.
workloads() {
  local suite spec w
  suite=$("$helper_py" tests/gpu/gpu_check.py suite tests/bench/run.py) || return 1
  printf '%s\n' "$suite"
  for spec in specs/bench/*.yaml; do
    w=$(basename "$spec" .yaml)
    cut -f1 <<<"$suite" | grep -qx "$w" || printf '%s\tdefault\t-\t-\t-\n' "$w"
  done
}

# spec_args PARAMS BINDS: -p and -i arguments of `ebb` for "d=64,hidden=128" "batch=8"
spec_args() {
  args=()
  local kv
  if [ "$1" != - ]; then for kv in ${1//,/ }; do args+=(-p "$kv"); done; fi
  if [ "$2" != - ]; then for kv in ${2//,/ }; do args+=(-i "$kv"); done; fi
}

# weights_for STEP W C FILLS: sets wargs to `--weights FILE` holding the seeded
# parameters with the bench's fills applied (feedback's halt.bias=-1000, so
# that every iteration runs, in ebb and in PyTorch alike), made on the CPU
# once; empty without fills. Needs args from spec_args.
weights_for() {
  wargs=()
  [ "$4" != - ] || return 0
  local raw=$results/weights/$2.$3.seeded.safetensors out=$results/weights/$2.$3.safetensors
  mkdir -p "$results/weights"
  if [ ! -f "$out" ] && [ -z "${listed[$out]:-}" ]; then
    (( dry_run )) && listed[$out]=1
    run "$1" "$results/weights/$2.$3.log" 60 "$ebb" run "specs/bench/$2.yaml" "${args[@]}" \
      --device cpu --save-weights "$raw" || return 1
    local fills
    IFS=, read -ra fills <<<"$4"
    run "$1" "$results/weights/$2.$3.fill.log" 30 "$helper_py" tests/gpu/gpu_check.py fill \
      "$raw" "$out" "${fills[@]}" || return 1
  fi
  wargs=(--weights "$out")
}

declare -A listed=()

# repeats CONFIG: how many runs a time is the median of
repeats() { case "$1" in dispatch) echo 200 ;; *) echo 50 ;; esac; }

# median LOG: the median ms of `ebb run`'s "time on DEV: median X ms" line
median() { sed -n 's/^time on .* median \([0-9.]*\) ms .*/\1/p' "$1" 2>/dev/null | head -n 1; }

# ---- peaks -----------------------------------------------------------------

# step_result STEP FAILURES_BEFORE WHAT: the step's row in the table
step_result() {
  (( dry_run )) && return
  local n=$((failures - $2))
  if (( n )); then record step "$1" FAILED "$n of $3 failed (rows below)"; else record step "$1" ok "$3"; fi
}

step_peaks() {
  check_binary_once
  local d=$results/peaks lim rc w c params binds fills line f0=$failures
  mkdir -p "$d"
  local rows
  mapfile -t rows < <(workloads)
  (( ${#rows[@]} )) || { fail_step peaks "no workloads: tests/bench/run.py's SUITE could not be read"; return; }
  say "peaks: ${#rows[@]} runs of specs/bench/ and 4 training steps on $device (logs: $d)"
  for line in "${rows[@]}"; do
    IFS=$'\t' read -r w c params binds fills <<<"$line"
    spec_args "$params" "$binds"
    lim=$(limit 60 $((100 + train_reserve))) || { record peak "bench/$w" "$c" - - - SKIPPED "out of time"; continue; }
    if ! weights_for peaks "$w" "$c" "$fills"; then
      failures=$((failures + 1))
      record peak "bench/$w" "$c" - - - FAIL "could not make its weights: $(why "$results/weights/$w.$c.log")"
      continue
    fi
    rc=0
    # the bench step takes its eager time from this run too
    run peaks "$d/$w.$c.log" "$lim" "$ebb" run "specs/bench/$w.yaml" "${args[@]}" "${wargs[@]}" \
      --device "$device" --repeat "$(repeats "$c")" --trace "$d/$w.$c.trace.jsonl" || rc=$?
    (( dry_run )) && continue
    peak_line "bench/$w" "$c" "$d/$w.$c" "$rc"
  done
  train_peaks "$d"
  step_result peaks "$f0" "$((${#rows[@]} + 4)) runs"
}

# peak_line LABEL CONFIG BASE RC: the summary's line from BASE.trace.jsonl, or
# what went wrong from BASE.log
peak_line() {
  local line
  if timed_out "$4"; then
    failures=$((failures + 1)); record peak "$1" "$2" - - - FAIL "ran out of time ($3.log)"
  elif [ "$4" -ne 0 ]; then
    failures=$((failures + 1)); record peak "$1" "$2" - - - FAIL "$(why "$3.log")"
  else
    line=$("$helper_py" tests/gpu/gpu_check.py peak "$3.trace.jsonl" "$1" "$2")
    printf '%s\n' "$line" >>"$summary"
    case "$line" in *$'\tFAIL'*) failures=$((failures + 1)) ;; esac
  fi
  return 0
}

# A training step of specs/mlp.yaml widened to hidden=1024, batch 512: ebb grad
# (one step, the first the process runs) and ebb train (its 4th step, traced
# once the optimizer state and libraries' workspaces exist), also under the
# least memory budget and in bfloat16.
train_peaks() {
  local d=$1 spec=specs/mlp.yaml p=(-p hidden=1024) batch=512 lim rc=0 line
  local sizes="hidden=1024,batch=$batch"
  lim=$(limit 30 $((100 + train_reserve))) || { record peak "mlp.yaml grad" "$sizes" - - - SKIPPED "out of time"; return; }
  run peaks "$d/mlp.train.plan.json" "$lim" "$ebb" plan "$spec" "${p[@]}" --train -i "batch=$batch" --json || rc=$?
  run peaks "$d/mlp.xy$batch.log" "$lim" "$helper_py" tests/gpu/gpu_check.py dataset "$d/mlp.train.plan.json" "$d/mlp.xy$batch.safetensors" "$batch" || rc=$?
  run peaks "$d/mlp.xy4096.log" "$lim" "$helper_py" tests/gpu/gpu_check.py dataset "$d/mlp.train.plan.json" "$d/mlp.xy4096.safetensors" 4096 || rc=$?
  if [ "$rc" -ne 0 ]; then
    failures=$((failures + 1))
    record peak "mlp.yaml train" "$sizes" - - - FAIL "no training data: $(why "$d/mlp.train.plan.json") $(why "$d/mlp.xy4096.log")"
    return
  fi
  lim=$(limit 60 $((100 + train_reserve))) || { record peak "mlp.yaml grad" "$sizes" - - - SKIPPED "out of time"; return; }
  rc=0
  run peaks "$d/mlp.grad.log" "$lim" "$ebb" grad "$spec" "${p[@]}" --inputs "$d/mlp.xy$batch.safetensors" \
    --grads "$d/mlp.grads.safetensors" --device "$device" --trace "$d/mlp.grad.trace.jsonl" || rc=$?
  (( dry_run )) || peak_line "mlp.yaml grad, step 1" "$sizes" "$d/mlp.grad" "$rc"
  lim=$(limit 60 $((100 + train_reserve))) || { record peak "mlp.yaml train" "$sizes" - - - SKIPPED "out of time"; return; }
  rc=0
  run peaks "$d/mlp.train.log" "$lim" "$ebb" train "$spec" "${p[@]}" --data "$d/mlp.xy4096.safetensors" \
    --batch "$batch" --steps 6 --device "$device" --trace "$d/mlp.train.trace.jsonl" --trace-step 4 \
    --json --log-every 1 || rc=$?
  (( dry_run )) || peak_line "mlp.yaml train, step 4" "$sizes" "$d/mlp.train" "$rc"
  # the same step planned for the least memory (recomputing in the backward),
  # and in bfloat16 mixed precision
  local extra label base
  for extra in "--memory-budget least" "--precision bf16"; do
    label="mlp.yaml train $extra, step 4"
    base=$d/mlp.train.${extra##* }
    lim=$(limit 60 $((100 + train_reserve))) || { record peak "$label" "$sizes" - - - SKIPPED "out of time"; continue; }
    rc=0
    # shellcheck disable=SC2086 # $extra is an option and its value
    run peaks "$base.log" "$lim" "$ebb" train "$spec" "${p[@]}" --data "$d/mlp.xy4096.safetensors" \
      --batch "$batch" --steps 6 --device "$device" --trace "$base.trace.jsonl" --trace-step 4 \
      --json --log-every 1 $extra || rc=$?
    (( dry_run )) || peak_line "$label" "$sizes" "$base" "$rc"
  done
  # the same six steps replayed from a CUDA graph: the eager run's losses
  lim=$(limit 60 $((100 + train_reserve))) || { record peak "mlp.yaml train --cuda-graph" "$sizes" - - - SKIPPED "out of time"; return; }
  rc=0
  run peaks "$d/mlp.graph.log" "$lim" "$ebb" train "$spec" "${p[@]}" --data "$d/mlp.xy4096.safetensors" \
    --batch "$batch" --steps 6 --device "$device" --cuda-graph --json --log-every 1 || rc=$?
  if (( dry_run )); then
    :
  elif [ "$rc" -ne 0 ]; then
    failures=$((failures + 1)); record peak "mlp.yaml train --cuda-graph" "$sizes" - - - FAIL "$(why "$d/mlp.graph.log")"
  else
    line=$("$helper_py" tests/gpu/gpu_check.py losses "mlp.yaml train --cuda-graph" "$sizes" "$d/mlp.train.log" "$d/mlp.graph.log")
    printf '%s\n' "$line" >>"$summary"
    case "$line" in *$'\tFAIL'*) failures=$((failures + 1)) ;; esac
  fi
}

# ---- bench -----------------------------------------------------------------

twin_na="n/a (tests/bench/ebb_bench runs its forward rows on the CPU only; its training rows are the train step's)"

step_bench() {
  check_binary_once
  [ -f tests/bench/torch_models.py ] || { fail_step bench "tests/bench/torch_models.py is missing: it holds the PyTorch twins"; return; }
  local d=$results/bench lim rc w c params binds fills line reps eager replay f0=$failures
  mkdir -p "$d"
  : >"$d/pytorch.rows"
  local rows
  mapfile -t rows < <(workloads)
  (( ${#rows[@]} )) || { fail_step bench "no workloads: tests/bench/run.py's SUITE could not be read"; return; }
  say "bench: ${#rows[@]} workloads, ebb eager and replay on $device, then PyTorch eager (logs: $d)"
  if (( dry_run )) && [[ " ${steps[*]} " == *" peaks "* ]]; then
    echo "  [bench] (ebb's eager times: the median of the peaks step's runs above)" | tee -a "$results/commands.txt"
  fi
  for line in "${rows[@]}"; do
    IFS=$'\t' read -r w c params binds fills <<<"$line"
    spec_args "$params" "$binds"
    reps=$(repeats "$c")
    lim=$(limit 60 $((40 + train_reserve))) || { record time "$w" "$c" "n/a (out of time)" "n/a (out of time)" "$twin_na"; continue; }
    weights_for bench "$w" "$c" "$fills" || { record time "$w" "$c" "FAIL (no weights)" - "$twin_na"; failures=$((failures + 1)); continue; }
    run bench "$d/$w.$c.plan.json" "$lim" "$ebb" plan "specs/bench/$w.yaml" "${args[@]}" --json || true
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$w" "$c" "$params" "$binds" "$fills" "$d/$w.$c.plan.json" "$reps" \
      >>"$d/pytorch.rows"
    # eager: the peaks step's run of the same plan, weights and repeats, else one here
    eager=$(median "$results/peaks/$w.$c.log")
    if [ -z "$eager" ] && ! { (( dry_run )) && [[ " ${steps[*]} " == *" peaks "* ]]; }; then
      rc=0
      run bench "$d/$w.$c.eager.log" "$lim" "$ebb" run "specs/bench/$w.yaml" "${args[@]}" "${wargs[@]}" \
        --device "$device" --repeat "$reps" || rc=$?
      if (( ! dry_run )); then
        eager=$(median "$d/$w.$c.eager.log")
        if [ "$rc" -ne 0 ] || [ -z "$eager" ]; then
          eager="FAIL ($(why "$d/$w.$c.eager.log"))"; failures=$((failures + 1))
        fi
      fi
    fi
    lim=$(limit 60 $((40 + train_reserve))) || { record time "$w" "$c" "$eager" "n/a (out of time)" "$twin_na"; continue; }
    rc=0
    run bench "$d/$w.$c.replay.log" "$lim" "$ebb" run "specs/bench/$w.yaml" "${args[@]}" "${wargs[@]}" \
      --device "$device" --repeat "$reps" --cuda-graph || rc=$?
    (( dry_run )) && continue
    replay=$(median "$d/$w.$c.replay.log")
    if grep -q 'cannot be captured\|only `for` loops can be captured' "$d/$w.$c.replay.log"; then
      replay="n/a (data-dependent control flow: ebb_plan_capture refuses it)"
    elif [ "$rc" -ne 0 ] || [ -z "$replay" ]; then
      replay="FAIL ($(why "$d/$w.$c.replay.log"))"; failures=$((failures + 1))
    fi
    record time "$w" "$c" "$eager" "$replay" "$twin_na"
  done
  # PyTorch eager: one process for every workload; a row it has no time or no
  # CUDA torch for says "n/a (why)"
  if lim=$(limit 180 "$train_reserve"); then
    run bench "$d/pytorch.log" "$lim" "$torch_py" tests/gpu/torch_eager.py "$d/pytorch.rows" \
      "$d/pytorch.tsv" "--device=$device" || true
    (( dry_run )) && return
    if [ -s "$d/pytorch.tsv" ]; then
      cat "$d/pytorch.tsv" >>"$summary"
    else
      say "bench: PyTorch eager gave no results: $(why "$d/pytorch.log")"
    fi
  fi
  step_result bench "$f0" "${#rows[@]} workloads"
}

# ---- train -----------------------------------------------------------------

# tests/bench/run.py's training rows on the device: ebb_bench (ebb's training
# plan and its libtorch C++ twin, interleaved step by step) and PyTorch eager,
# taking turns by rounds; each row's line comes from run.py's --train-rows
# file as soon as the row is done, so a run cut short keeps what it finished.
# torch.compile is left out here (tens of seconds of compiling a row).
step_train() {
  check_binary_once
  local d=$results/train lim rc=0 f0=$failures bench_bin=$build/tests/bench/ebb_bench missing n
  mkdir -p "$d"
  if (( ! dry_run )) && [ ! -x "$bench_bin" ]; then
    fail_step train "$bench_bin is missing: configure $build with -DEBB_BUILD_BENCH=ON (the build step does) and build ebb_bench"
    return
  fi
  [ -f tests/bench/run.py ] || { fail_step train "tests/bench/run.py is missing: it drives the training rows"; return; }
  lim=$(limit "${EBB_GPU_TRAIN_TIMEOUT:-240}" 0) || {
    record step train "not run" "out of time: no time left in the budget of $budget s"
    say "train: not run: out of time"
    return
  }
  (( dry_run )) || : >"$d/rows.jsonl"
  say "train: tests/bench/run.py's training rows on $device, ebb, C++ twin and PyTorch eager, at most $lim s (log: $d/run.log)"
  run train "$d/run.log" "$lim" env PYTHONUNBUFFERED=1 "$torch_py" tests/bench/run.py \
    --build "$build" --device "$device" --train-only --no-fashion --no-remat --no-compile \
    --out "$d" --train-rows "$d/rows.jsonl" || rc=$?
  (( dry_run )) && return
  # the parameters run.py exported for PyTorch (tens of MB) are no result
  rm -f "$d"/train_*.bin "$d"/train_*.json
  # the rows run.py did not finish
  if timed_out "$rc"; then
    missing="n/a (not reached: run.py ran out of its $lim s; see train/run.log)"
  elif [ "$rc" -ne 0 ]; then
    missing="FAIL (run.py stopped: $(grep -m1 '^bench: error: ' "$d/run.log" | cut -c15-200 || true))"
    [ "$missing" != "FAIL (run.py stopped: )" ] || missing="FAIL (run.py stopped: $(why "$d/run.log"))"
  else
    missing="n/a (no result from run.py; see train/run.log)"
  fi
  missing=${missing//$'\t'/ }
  if ! "$helper_py" tests/gpu/gpu_check.py train "$d/rows.jsonl" tests/bench/run.py "$missing" \
       >"$d/summary.tsv" 2>"$d/summary.log"; then
    fail_step train "could not read run.py's rows: $(why "$d/summary.log")"
    return
  fi
  cat "$d/summary.tsv" >>"$summary"
  # a failure per row that failed itself (not the rows run.py never reached),
  # and one for run.py stopping
  n=$(awk -F'\t' -v m="$missing" '($4 ~ /^FAIL/ && $4 != m) || $13 ~ /^FAIL/' "$d/summary.tsv" | wc -l)
  failures=$((failures + n))
  local total done
  total=$(wc -l <"$d/summary.tsv")
  done=$(grep -c . "$d/rows.jsonl" || true)
  if [ "$rc" -ne 0 ] && ! timed_out "$rc"; then
    failures=$((failures + 1))
    local reason=${missing#FAIL (run.py stopped: }
    say "train: run.py stopped: ${reason%)}"
    record step train FAILED "run.py stopped after $done of $total training rows on $device ($n of them failed): ${reason%)} (train/run.log)"
  else
    step_result train "$f0" "$done of $total training rows on $device$(timed_out "$rc" && echo " (run.py ran out of its $lim s)")"
  fi
}

checked_binary=0
check_binary_once() { (( checked_binary )) || { check_binary; checked_binary=1; }; }

# ---- main --------------------------------------------------------------------

build_failed=0
for step in "${steps[@]}"; do
  [ -n "$step" ] || continue
  if (( build_failed )); then record step "$step" "not run" "the build failed"; continue; fi
  case "$step" in
    build) step_build || build_failed=1 ;;
    test) step_test || fail_step test "stopped (status $?): see $results/ctest.log" ;;
    peaks) step_peaks || fail_step peaks "stopped (status $?): see $results/peaks/" ;;
    bench) step_bench || fail_step bench "stopped (status $?): see $results/bench/" ;;
    train) step_train || fail_step train "stopped (status $?): see $results/train/" ;;
  esac
  if (( dry_run )) && [ "$step" != build ]; then
    record step "$step" listed "dry run: its commands are listed above and in $results/commands.txt"
  fi
done

{
  echo
  echo "gpu-check $( (( dry_run )) && echo '(dry run) ')in $SECONDS s of a budget of $budget s, $failures failure(s); device $device${gpu_name:+: $gpu_name}"
  # the host's CPU too: the CPU suites' kernels (oneDNN's AMX ones) depend on it
  cpu_name=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1 || true)
  cpu_isa=$(grep -o -w 'amx_bf16\|avx512_bf16\|avx512f' /proc/cpuinfo 2>/dev/null | sort -u |
            tr '\n' ' ' || true)
  echo "host CPU: ${cpu_name:-unknown}, $(nproc) cores${cpu_isa:+, $cpu_isa}"
  echo "${version:-ebb: not built}; libtorch $torch_prefix"
  echo "logs: $results (commands.txt, configure.log, build.log, ctest.log, peaks/, bench/, train/)"
} | sed 's/^/info\t/' >"$summary.head"
cat "$summary" >>"$summary.head" && mv "$summary.head" "$summary"
"$helper_py" tests/gpu/gpu_check.py table "$summary" | tee "$results/table.txt"
if [ -n "${OUT:-}" ] && [ -d "$OUT" ] && (( ! dry_run )); then
  cp "$results/table.txt" "$OUT/gpu-check-table.txt"
  tar -czf "$OUT/gpu-check-logs.tgz" -C "$results" --exclude='*.jsonl' --exclude='*.safetensors' \
    --exclude='*.bin' . 2>/dev/null || say "could not archive $results into \$OUT"
fi
(( failures == 0 ))
