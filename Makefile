# Attic: the two commands a fresh Debian 12 machine needs.
#   make run   install missing packages, build, start the Attic server on the default model
#              (KV store: the automatic DRAM tier, and an SSD tier in out/kv-ssd that keeps
#              conversations and context caches across restarts; KV_SSD_DIR=DIR moves it,
#              KV_SSD_DIR= turns it off)
#   make test  install missing packages, build, run every test
SHARED ?= $(abspath ../shared)
MODEL  ?= $(SHARED)/models/stories260K-hf
BUILD  ?= build
JOBS   ?= $(shell nproc)
HOST   ?= 127.0.0.1
PORT   ?= 8080
KV_SSD_DIR ?= out/kv-ssd

.PHONY: all deps build run test bench clean

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

test: build
	cd $(BUILD) && ATTIC_SHARED_DIR=$(SHARED) ctest --output-on-failure -j$(JOBS)

clean:
	rm -rf $(BUILD)
