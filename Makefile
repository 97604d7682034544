# The two commands a user runs: `make demo` and `make test`. Both install what is missing first.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
DEMO_MODEL ?= tests/fixtures/tiny-mixtral

.PHONY: all deps build test demo fuzz sanitize format clean

all: build

deps:
	@scripts/install-deps

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

test: build fuzz
	@scripts/install-test-deps
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

demo: build
	$(BUILD)/nibble generate --model-path $(DEMO_MODEL) --device cpu \
	  --quantization quark_int4fp8_moe --prompt "The quick brown fox" --max-new-tokens 24

# libFuzzer on the safetensors header parser, for a bounded time (clang build in its own folder).
FUZZ_SECONDS ?= 60
fuzz: deps
	cmake -S . -B $(BUILD)-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
	  -DNIBBLE_FUZZ=ON -DNIBBLE_TESTS=OFF -DNIBBLE_CUDA=OFF
	cmake --build $(BUILD)-fuzz -j $(JOBS) --target fuzz_safetensors_header
	mkdir -p $(BUILD)-fuzz/corpus
	$(BUILD)-fuzz/fuzz/fuzz_safetensors_header -max_total_time=$(FUZZ_SECONDS) -max_len=4096 \
	  $(BUILD)-fuzz/corpus fuzz/seeds/safetensors_header

# The CPU tests under AddressSanitizer and UBSan.
sanitize: deps
	cmake -S . -B $(BUILD)-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DNIBBLE_SANITIZE=ON -DNIBBLE_CUDA=OFF
	cmake --build $(BUILD)-asan -j $(JOBS)
	@scripts/install-test-deps
	ctest --test-dir $(BUILD)-asan --output-on-failure -j $(JOBS)

format:
	find src app tests fuzz bench -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' | xargs clang-format -i

clean:
	rm -rf $(BUILD) $(BUILD)-fuzz $(BUILD)-asan
