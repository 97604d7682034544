# The two commands a user runs: `make demo` and `make test`. Both install what is missing first.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
# The trained demo MoE (models/demo-moe, README "The demo model") once it is there, else the tiny
# random fixture; on the GPU when nvidia-smi finds one and the build has the CUDA backend.
DEMO_MODEL ?= $(if $(wildcard models/demo-moe/model.safetensors),models/demo-moe,tests/fixtures/tiny-mixtral)
DEMO_QUESTION ?= A shop sells pencils in boxes of 12. Sam buys 4 boxes and already has 9 pencils at home. How many pencils does Sam have in total?
DEMO_PROSE ?= It is a truth universally acknowledged

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
	@device=cpu; if [ -d $(BUILD)/src/cuda ] && nvidia-smi -L >/dev/null 2>&1; then device=cuda; fi; \
	flags="--model-path $(DEMO_MODEL) --device $$device --quantization quark_int4fp8_moe --kv-cache-dtype fp8_e4m3"; \
	echo "== $(DEMO_MODEL) on $$device, INT4 experts with FP8 math (W4A8), FP8 KV cache: a word problem"; \
	$(BUILD)/nibble generate $$flags --max-new-tokens 48 --prompt "$$(printf 'Question: %s\nAnswer:' '$(DEMO_QUESTION)')" && \
	echo "== a prose continuation" && \
	$(BUILD)/nibble generate $$flags --max-new-tokens 48 --prompt "$(DEMO_PROSE)"

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
