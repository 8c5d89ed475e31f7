# Top-level entry points. Each target installs what is missing (scripts/setup.sh), configures,
# builds and runs; see README.md.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
PREFIX ?= /usr/local

.PHONY: all deps configure build install demo bench bench-gemm bench-conv bench-resnet-conv bench-ort bench-load bench-cuda bench-compile test test-cuda-compile test-sanitize fuzz format clean

all: build

deps:
	@bash scripts/setup.sh

$(BUILD_DIR)/build.ninja: | deps
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

configure: $(BUILD_DIR)/build.ninja

build: deps configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# Installs kiln, libkiln.so, the headers and the CMake package under PREFIX (default /usr/local;
# e.g. make install PREFIX=$$HOME/.local); a project then does find_package(kiln), see
# examples/embed. Builds only what is installed.
install: deps configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target kiln kiln_shared kiln_python
	cmake --install $(BUILD_DIR) --prefix $(PREFIX)

# Builds kiln (not the tests), the ResNet-18-shaped demo model if needed, then compiles the model
# (code cache: $(BUILD_DIR)/demo-cache) and runs it; see scripts/demo.sh.
demo: deps configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target kiln
	bash scripts/demo.sh $(BUILD_DIR)

# STREAM triad bandwidth versus a Kiln-compiled fused pointwise chain (bench/stream_bench.cpp).
bench: deps configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target kiln_stream_bench
	$(BUILD_DIR)/bin/kiln_stream_bench

# The C++ GEMM template's configs against OpenBLAS and oneDNN matmul (bench/gemm_bench.cpp).
bench-gemm: deps configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target kiln_gemm_bench
	$(BUILD_DIR)/bin/kiln_gemm_bench

# Conv -> BatchNormalization -> Relu -> Add fused into one call against convolution plus a
# separate kernel, at ResNet-50's 3x3 shapes (bench/conv_block_bench.cpp).
bench-conv: deps configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target kiln_conv_block_bench
	$(BUILD_DIR)/bin/kiln_conv_block_bench

# Kiln against ONNX Runtime 1.30 (npm's onnxruntime-node, installed under $(BUILD_DIR)/bench-ort)
# on a ResNet-50-shaped CNN, a MobileNetV2, a BERT-base-shaped encoder stack, a small encoder and
# a GPT-style decoder, alternating, 2 threads each (bench/ort/run.sh).
bench-ort: deps configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target kiln
	bash bench/ort/run.sh $(BUILD_DIR)

# Latency under load (issue 14): Kiln and ONNX Runtime 1.30 on a tiny MLP and a ResNet-18-shaped
# CNN, idle, with one busy process per core and with one and a half, alternating; prints p50, p99
# and loaded/idle ratios (bench/load/run.sh; CPUS=2,3 pins everything to those CPUs).
bench-load: deps configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target kiln
	bash bench/load/run.sh $(BUILD_DIR)

# On a machine with an NVIDIA GPU, PyTorch, onnx and onnxruntime: Kiln's latency on bench/ort's
# ResNet-50-shaped CNN and BERT-base-shaped encoder next to PyTorch eager and torch.compile at fp32
# and TF32, Kiln's outputs against onnxruntime's, the generated kernels' bandwidth against the
# GPU's copy, and compute-sanitizer on both models (scripts/device_bench_cuda.sh). For a GPU
# machine without Kiln's build dependencies, scripts/device_bundle.sh packs this build and
# `STAGES=bench run.sh` runs the same script there.
bench-cuda: deps configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target kiln kiln_cuda_pointwise_bench
	bash scripts/device_bench_cuda.sh $(BUILD_DIR)/bin

# The convolution choices at ResNet-50's Conv layers, selected in max mode: each layer's chosen
# choice, heuristic, best template, oneDNN and im2col + OpenBLAS (bench/resnet_conv_bench.cpp).
bench-resnet-conv: deps configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target kiln_resnet_conv_bench
	$(BUILD_DIR)/bin/kiln_resnet_conv_bench

# Cold compile times of long elementwise chains (1k, 4k, 16k nodes at small and large shapes) and
# of a transformer encoder stack at 1, 4 and 16 layers (bench/compile_bench.py).
bench-compile: deps configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target kiln
	/usr/bin/python3 bench/compile_bench.py $(BUILD_DIR)/bin/kiln $(BUILD_DIR)/bench-compile

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

# NVRTC compiles the CUDA kernels of every ONNX suite case, as `kiln run --device cuda` would
# generate them, for sm_80 and sm_90 (no GPU needed; needs the CUDA toolkit). `make test` runs a
# 220-case sample of it (onnx.cuda_compile).
test-cuda-compile: deps configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target test-cuda-compile

# The unit tests, the command-line tests and a 220-case sample of the ONNX suite
# (tests/onnx/sanitize_cases.txt) under AddressSanitizer and UndefinedBehaviorSanitizer, the
# generated kernels and wrappers included (KILN_SANITIZE), in build-asan; then the concurrent-run
# tests under ThreadSanitizer in build-tsan (scripts/test_sanitize.sh). Not part of `make test`.
test-sanitize: deps
	JOBS=$(JOBS) bash scripts/test_sanitize.sh

# The libFuzzer targets of tests/fuzz (clang, ASan + UBSan, in build-fuzz), seeded from the ONNX
# suite, FUZZ_SECONDS seconds each (default 60) with FUZZ_JOBS processes (scripts/fuzz.sh).
FUZZ_SECONDS ?= 60
FUZZ_JOBS ?= 1
fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_JOBS=$(FUZZ_JOBS) JOBS=$(JOBS) bash scripts/fuzz.sh

format:
	find src include tests bench examples -name '*.h' -o -name '*.cpp' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR)
