# Attic: the two commands a fresh Debian 12 machine needs.
#   make run   install missing packages, build, start the Attic server on the default model
#              (KV store: the automatic DRAM tier, and an SSD tier in out/kv-ssd that keeps
#              conversations and context caches across restarts; KV_SSD_DIR=DIR moves it,
#              KV_SSD_DIR= turns it off)
#   make test  install missing packages, build, run every test (with each fuzzer's corpus
#              replayed), then the same code built with ASan+UBSan (unit tests,
#              integration tests, each fuzzer for a fixed number of runs) and with TSan
#              (store, scheduler and remote-tier tests) (docs/fuzzing.md); SANITIZE=0
#              skips the sanitizer builds
#   make fuzz SECONDS=N   run every fuzzer N seconds (docs/fuzzing.md)
SHARED ?= $(abspath ../shared)
MODEL  ?= $(SHARED)/models/stories260K-hf
BUILD  ?= build
JOBS   ?= $(shell nproc)
HOST   ?= 127.0.0.1
PORT   ?= 8080
KV_SSD_DIR ?= out/kv-ssd

# The sanitizer builds (docs/fuzzing.md) run by default; SANITIZE=0 skips them (a quick
# loop: the release build's tests only).
SANITIZE ?= 1
SECONDS ?= 60
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
# Under ASan: every test but the ISA matrix's extra legs and the docs' commands (both run by
# the release build), with ATTIC_ISA=generic: the SIMD kernel files are not instrumented
# (CMakeLists.txt, ATTIC_KERNEL_FLAGS), so the ASan run computes with the scalar kernels,
# and every buffer a kernel is handed is read and written by instrumented code. For the
# same reason the attention tests' AVX2/AVX-512 parameters (they call those kernels
# directly, whatever ATTIC_ISA says) are left to the release build: under ASan they only
# repeat the instrumented float64 reference (~240 s of CPU) around uninstrumented code.
# What the sanitizer builds build: the tests, the server (integration tests) and the
# fuzzers; not the benchmark programs.
ASAN_TARGETS ?= core_test backend_test tokenizer_test model_test attention_test kv_test store_test grammar_test \
                pq_test engine_test pic_test server_test eval_test cli_test bench_test redis_test attic attic_fuzzers
ASAN_EXCLUDE ?= ^isa-|^docs_commands$$|^Isas/Attention(Mixed)?Test\..*/avx(2|512)_
# Under TSan: the tests whose threads share KV buffers: every test of the store (loader,
# writer, prefetcher, streamer; ctest label store) and of the remote tier (label redis),
# and the engine's tests that run the scheduler (its step loop, the HTTP-facing queue,
# the store behind it).
TSAN_LABELS ?= ^(store|redis)$$
TSAN_ENGINE_TESTS ?= ^(Scheduler|SparseScheduler|KvTypes/SparseSchedulerOffload|StoreIntegration|SparseResume|TruncationModes|Reuse|ResidentPolicy|LinkTest)\.

.PHONY: all deps build anchor run test test-asan test-tsan fuzz bench clean

all: build

deps:
	@scripts/install-deps.sh

# ccache, where installed, keeps rebuilds (and the sanitizer builds) short; not required.
CCACHE := $(shell command -v ccache 2> /dev/null)
LAUNCHER := $(if $(CCACHE),-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(LAUNCHER) > /dev/null
	@cmake --build $(BUILD) -j$(JOBS)

run: build
	$(BUILD)/attic serve --model $(MODEL) --host $(HOST) --port $(PORT) $(if $(KV_SSD_DIR),--kv-ssd-dir $(KV_SSD_DIR))

# llama.cpp, the reference of the GGUF tests (greedy agreement, its quantizer's files):
# the prebuilt library from npm and the harness of ../shared/tools/llamacpp-anchor, built
# once in out/anchor. Without it those tests skip.
anchor:
	@SHARED=$(SHARED) scripts/setup-llamacpp.sh

test: build anchor
	cd $(BUILD) && ATTIC_SHARED_DIR=$(SHARED) ctest --output-on-failure -j$(JOBS)
ifneq ($(SANITIZE),0)
	@$(MAKE) --no-print-directory test-asan test-tsan
endif

test-asan: deps
	@JOBS=$(JOBS) scripts/sanitize-build.sh asan $(ASAN_BUILD) $(ASAN_TARGETS)
	cd $(ASAN_BUILD) && ATTIC_ISA=generic ATTIC_SHARED_DIR=$(SHARED) ctest --output-on-failure -j$(JOBS) -E '$(ASAN_EXCLUDE)'

test-tsan: deps
	@JOBS=$(JOBS) scripts/sanitize-build.sh tsan $(TSAN_BUILD) store_test engine_test redis_test
	cd $(TSAN_BUILD) && ATTIC_SHARED_DIR=$(SHARED) ctest --output-on-failure -j$(JOBS) -L '$(TSAN_LABELS)'
	cd $(TSAN_BUILD) && ATTIC_SHARED_DIR=$(SHARED) ctest --output-on-failure -j$(JOBS) -R '$(TSAN_ENGINE_TESTS)'

fuzz: deps
	@JOBS=$(JOBS) scripts/sanitize-build.sh asan $(ASAN_BUILD) attic_fuzzers
	scripts/fuzz.sh $(ASAN_BUILD) $(SECONDS)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
