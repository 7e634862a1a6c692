# ebb: two commands do everything on a fresh Debian machine.
#   make demo   installs what is missing, builds, trains a model on Fashion-MNIST
#   make test   installs what is missing, builds, runs every test through ctest
# Other targets: build, deps, torch-pip, test-asan, bench, fuzz, gpu-check, clean.
#
# TORCH picks the libtorch: `debian` (the default, libtorch-dev 1.13, CPU) or
# `pip` (pip's CUDA build of torch TORCH_PIP_VERSION, installed into the
# virtual environment TORCH_VENV; its build folder is build-pip):
#   make test TORCH=pip

TORCH    ?= debian
JOBS     ?= 2
CMAKE_FLAGS ?=

# The pip torch: the version the GPU machine's python carries, so that what CI
# compiles is what the device compiles. A newer one: TORCH_PIP_VERSION=2.12.0.
TORCH_PIP_VERSION ?= 2.11.0
TORCH_VENV  ?= $(HOME)/.cache/ebb/torch-$(TORCH_PIP_VERSION)
TORCH_PY    := $(TORCH_VENV)/bin/python
# the interpreter that makes the virtual environment (pip's, first on PATH)
PIP_PYTHON  ?= python3

ifeq ($(TORCH),pip)
BUILD    ?= build-pip
TORCH_DEPS := torch-pip
TORCH_CMAKE_FLAGS = -DCMAKE_PREFIX_PATH="$$($(TORCH_PY) -c 'import torch; print(torch.utils.cmake_prefix_path)')" \
                    -DEBB_TORCH_PYTHON=$(TORCH_PY)
else ifeq ($(TORCH),debian)
BUILD    ?= build
TORCH_DEPS :=
TORCH_CMAKE_FLAGS :=
else
$(error TORCH=$(TORCH): use TORCH=debian (libtorch-dev 1.13) or TORCH=pip (pip torch $(TORCH_PIP_VERSION)))
endif

# Debian packages the build and the tests need. libopenblas0-pthread matters:
# Debian's libtorch falls back to the reference BLAS without it (25x slower).
# fortunes: text under /usr/share/games/fortunes/ for language models
# (docs/training.md).
# python3-torch: Debian's torch over the same libtorch, which makes the
# bfloat16 reference runs at test time (tests/CMakeLists.txt, reference_runs).
DEB_PACKAGES := cmake g++ make pkg-config libtorch-dev libopenblas0-pthread \
                libyaml-dev libcjson-dev zlib1g-dev libcmocka-dev graphviz librsvg2-bin \
                libgloo-dev dataset-fashion-mnist fortunes iproute2 python3-torch

.PHONY: all build deps torch-pip fuzz-deps demo test test-cpu test-asan bench fuzz gpu-check clean

all: build

# Installs $(1) when missing: as root with apt-get, else prints the command.
define install_missing
	@missing=""; \
	for p in $(1); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ]; then \
	  echo "ebb: missing Debian packages:$$missing"; \
	  echo "run: sudo apt-get install -y --no-install-recommends$$missing"; \
	  exit 1; \
	fi; \
	echo "ebb: installing$$missing"; \
	export DEBIAN_FRONTEND=noninteractive; \
	apt-get install -y --no-install-recommends $$missing || \
	  { apt-get update && apt-get install -y --no-install-recommends $$missing; }
endef

deps:
	$(call install_missing,$(DEB_PACKAGES))

# `make fuzz` also needs clang and libFuzzer's runtime.
FUZZ_PACKAGES := clang libclang-rt-14-dev
fuzz-deps: deps
	$(call install_missing,$(FUZZ_PACKAGES))

# pip's torch in a virtual environment of its own, made once (about 4.6 GB:
# torch with its CUDA libraries, which libtorch_cuda.so loads even on a
# machine without a GPU). numpy quiets torch's import warning.
TORCH_STAMP := $(TORCH_VENV)/.ebb-installed
torch-pip: $(TORCH_STAMP)
$(TORCH_STAMP):
	@command -v $(PIP_PYTHON) >/dev/null || { echo "ebb: $(PIP_PYTHON) not found; set PIP_PYTHON to a python3 that has venv and pip"; exit 1; }
	$(PIP_PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_PY) -m pip install --quiet --progress-bar off torch==$(TORCH_PIP_VERSION) numpy
	$(TORCH_PY) -c 'import torch; print("ebb: pip torch", torch.__version__, "at", torch.utils.cmake_prefix_path)'
	touch $@

$(BUILD)/CMakeCache.txt: | deps $(TORCH_DEPS)
	cmake -S . -B $(BUILD) $(TORCH_CMAKE_FLAGS) $(CMAKE_FLAGS)

build: deps $(TORCH_DEPS) $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j$(JOBS)

# First a model learning: specs/fashion_mlp.yaml trained for one epoch on
# Fashion-MNIST (progress on a terminal, a line every 200 steps otherwise),
# evaluated on the test split, its training plan drawn with its memory over
# the steps. Then the C example, and a spec with a switch through the
# command: a run measured next to planned bytes and traced, its plan drawn.
TRAIN_SPEC ?= specs/fashion_mlp.yaml
DEMO_SPEC  ?= specs/switch_routed.yaml
demo: build
	$(BUILD)/ebb train $(TRAIN_SPEC) --data fashion-mnist --eval-data fashion-mnist:test \
	  --epochs 1 --log-every 200 --save-weights $(BUILD)/demo-weights.safetensors \
	  --curve $(BUILD)/demo-curve.svg
	$(BUILD)/ebb eval $(TRAIN_SPEC) --weights $(BUILD)/demo-weights.safetensors --data fashion-mnist:test
	$(BUILD)/ebb chart $(TRAIN_SPEC) --train -i batch=64 -o $(BUILD)/demo-train-chart.svg
	$(BUILD)/examples/residual_mlp
	$(BUILD)/ebb run $(DEMO_SPEC) -i batch=16 --repeat 20 --trace $(BUILD)/demo-trace.jsonl
	$(BUILD)/ebb dot $(DEMO_SPEC) --plan -i batch=16 -o $(BUILD)/demo-plan.svg
	$(BUILD)/ebb chart $(DEMO_SPEC) -i batch=16 --trace $(BUILD)/demo-trace.jsonl -o $(BUILD)/demo-chart.svg
	@echo "learning curve in $(BUILD)/demo-curve.svg; training plan drawn in $(BUILD)/demo-train-chart.svg; $(DEMO_SPEC)'s plan in $(BUILD)/demo-plan.svg, its memory with the run's trace in $(BUILD)/demo-chart.svg"

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)

# The numeric suites once more with the kernels another CPU would run:
# CPU=avx2 (the default) caps ATen, oneDNN and the BLAS at what an AVX2 CPU
# without AVX-512 picks, CPU=default at SSE (ATen's unvectorised loops).
# tests/cpu_caps.sh first checks that each library took its cap. Planned
# bytes must hold there too: oneDNN's scratch differs by instruction set.
CPU ?= avx2
CPU_CAPS_avx2    := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2 \
                    OPENBLAS_CORETYPE=Haswell MKL_ENABLE_INSTRUCTIONS=AVX2
CPU_CAPS_default := ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 DNNL_MAX_CPU_ISA=SSE41 \
                    OPENBLAS_CORETYPE=Prescott MKL_ENABLE_INSTRUCTIONS=SSE4_2
NUMERIC_TESTS := ^(test_parity|test_op_grad|test_op_conformance|test_ops|test_train|test_bounds.*|reference_runs|fixtures_match_torch)$$
test-cpu: build
	$(if $(CPU_CAPS_$(CPU)),,$(error CPU=$(CPU): use CPU=avx2 or CPU=default))
	env $(CPU_CAPS_$(CPU)) bash tests/cpu_caps.sh $(BUILD) $(CPU)
	env $(CPU_CAPS_$(CPU)) ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS) -R '$(NUMERIC_TESTS)'

# The whole suite again under AddressSanitizer and UBSan (Debian's libtorch),
# in a build folder of its own. Leaks are reported too, less what
# tests/asan.supp lists (nothing today). A
# failed allocation returns NULL, as without ASan, so the tests that run
# under a small RLIMIT_AS see libtorch's out-of-memory errors. The consumer
# test is left out: a program not built with ASan cannot load an ASan-built
# libebb. The launcher's fault loop (test_cli, test_agent_fault_loop) runs
# 16 jobs here, each three sanitized processes, and its 50 in the plain builds.
ASAN_BUILD ?= build-asan
SANITIZE := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DEBB_BUILD_EXAMPLES=OFF -DCMAKE_C_FLAGS="$(SANITIZE)" \
	  -DCMAKE_CXX_FLAGS="$(SANITIZE)" -DEBB_TEST_TIMEOUT=1800 $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j$(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1:allocator_may_return_null=1 \
	LSAN_OPTIONS=suppressions=$(CURDIR)/tests/asan.supp:print_suppressions=0 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 EBB_FAULT_RUNS=16 \
	  ctest --test-dir $(ASAN_BUILD) --output-on-failure -j$(JOBS) -E install_consumer

# ebb against hand-written libtorch C++ and PyTorch eager, side by side
# (tests/bench/, docs/benchmarks.md). Not part of `make test`. PyTorch is the
# one of the libtorch built against: Debian's python3-torch 1.13, or with
# TORCH=pip the virtual environment's torch 2.x, which adds torch.compile.
ifeq ($(TORCH),pip)
BENCH_PACKAGES :=
BENCH_PY := $(TORCH_PY)
else
BENCH_PACKAGES := python3-torch
BENCH_PY := /usr/bin/python3
endif
bench: deps $(TORCH_DEPS)
	$(call install_missing,$(BENCH_PACKAGES))
	cmake -S . -B $(BUILD) -DEBB_BUILD_BENCH=ON $(TORCH_CMAKE_FLAGS) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j$(JOBS) --target ebb_bench ebb_fashion_bench ebb_remat_bench ebb_first_steps_bench ebb_generate_bench
	EBB_BENCH_PYTHON=$(BENCH_PY) bash tests/bench/run.sh $(BUILD)

# On a machine with an NVIDIA GPU and a CUDA libtorch (../shared/device):
# a Release build, ctest on the GPU, planned against measured device bytes,
# CUDA-graph replay against eager, one table last (tests/gpu/run.sh).
# `make gpu-check GPU_CHECK_FLAGS=--dry-run` configures, compiles and lists
# what it would run, on any machine; CI runs that against the pip torch.
# The GPU machine has its own pip torch and no package archive: it runs plain
# `make gpu-check`; TORCH=pip here builds against the virtual environment's.
GPU_CHECK_FLAGS ?=
gpu-check: $(TORCH_DEPS)
	$(if $(filter pip,$(TORCH)),EBB_TORCH_PYTHON=$(TORCH_PY)) bash tests/gpu/run.sh $(GPU_CHECK_FLAGS)

# A libFuzzer run over the YAML loader and the compiler (ASan + UBSan). The
# compiler's dry run allocates no activations, so every input compiles within
# the 2 GiB RSS limit, however large the shapes it declares.
FUZZ_BUILD ?= build-fuzz
FUZZ_TIME  ?= 60
fuzz: fuzz-deps
	cmake -S . -B $(FUZZ_BUILD) -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DEBB_FUZZ=ON -DEBB_BUILD_TESTS=OFF -DEBB_BUILD_EXAMPLES=OFF $(CMAKE_FLAGS)
	cmake --build $(FUZZ_BUILD) -j$(JOBS) --target fuzz_spec
	mkdir -p $(FUZZ_BUILD)/corpus
	OMP_NUM_THREADS=1 ./$(FUZZ_BUILD)/tests/fuzz/fuzz_spec -max_total_time=$(FUZZ_TIME) -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 -dict=tests/fuzz/spec.dict $(FUZZ_BUILD)/corpus specs tests/specs_bad

clean:
	rm -rf $(BUILD) $(FUZZ_BUILD) $(ASAN_BUILD)
