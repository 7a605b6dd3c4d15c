# Thin front door over CMake. `make run` and `make test` work on a fresh Debian
# machine: they install the Debian packages first (`make deps`).
BUILD_DIR ?= build
PREFIX    ?= /usr/local
JOBS      ?= $(shell nproc 2>/dev/null || echo 2)
CUDA      ?= AUTO
WERROR    ?= $(if $(CI),ON,OFF)
CMAKE_ARGS ?=

# Exactly what building, testing and the demo need (CUDA comes from NVIDIA's toolkit, not here).
DEB_BUILD   = g++ make cmake pkg-config libopenmpi-dev openmpi-bin libhdf5-dev hdf5-tools \
              libstb-dev catch2 libdnnl-dev zlib1g-dev
DEB_RUNTIME = python3 python3-numpy python3-torch python3-torchvision python3-h5py python3-pil \
              dataset-fashion-mnist slurm-wlm munge gnuplot-nox procps shellcheck
DEB_PACKAGES = $(DEB_BUILD) $(DEB_RUNTIME)

.PHONY: all build deps test run demo clean install bench bench-quick gpu-bundle

all: build

build: $(BUILD_DIR)/CMakeCache.txt
	cmake --build $(BUILD_DIR) -j $(JOBS)
	@for p in resnet_ddp message_passing; do \
	  if [ -x $(BUILD_DIR)/$$p ]; then ln -sf $(BUILD_DIR)/$$p ./$$p; fi; done

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release -DRESNET_DDP_CUDA=$(CUDA) \
	  -DRESNET_DDP_WERROR=$(WERROR) $(CMAKE_ARGS)

# Idempotent: installs only the packages that are missing.
deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then echo "deps: all Debian packages present"; else \
	  echo "deps: installing$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends $$missing; \
	fi

test: deps
	$(MAKE) build
	cd $(BUILD_DIR) && ctest --output-on-failure -j 2 --timeout 900

run: deps
	$(MAKE) build
	$(MAKE) demo

demo:
	./tools/demo.sh

bench: build
	./bench/run_bench.sh

bench-quick: build
	./bench/run_bench.sh --quick

# Everything a GPU host without package access needs, in bundle/gpu (see docs/cuda.md).
gpu-bundle:
	./tools/gpu_bundle.sh

install: build
	cmake --install $(BUILD_DIR) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD_DIR) ./resnet_ddp ./message_passing
