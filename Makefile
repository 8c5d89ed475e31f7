# Top-level entry points. Each target installs what is missing (scripts/setup.sh), configures,
# builds and runs; see README.md.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)

.PHONY: all deps configure build demo bench bench-gemm bench-conv bench-resnet-conv test format clean

all: build

deps:
	@bash scripts/setup.sh

$(BUILD_DIR)/build.ninja: | deps
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

configure: $(BUILD_DIR)/build.ninja

build: deps configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

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

# The convolution choices at ResNet-50's Conv layers, selected in max mode: each layer's chosen
# choice, heuristic, best template, oneDNN and im2col + OpenBLAS (bench/resnet_conv_bench.cpp).
bench-resnet-conv: deps configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target kiln_resnet_conv_bench
	$(BUILD_DIR)/bin/kiln_resnet_conv_bench

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

format:
	find src include tests bench examples -name '*.h' -o -name '*.cpp' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR)
