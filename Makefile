# Thin front door over CMake. `make run` and `make test` work on a fresh Debian
# machine: they install the Debian packages first (`make deps`).
BUILD_DIR ?= build
, := ,
PREFIX    ?= /usr/local
JOBS      ?= $(shell nproc 2>/dev/null || echo 2)
CUDA      ?= AUTO
WERROR    ?= $(if $(CI),ON,OFF)
CMAKE_ARGS ?=
# PyTorch to compare with in `make bench`: debian (python3-torch 1.13) or pypi (torch 2.15 in
# a venv created on first use, see bench/torch_pypi_venv.sh).
TORCH     ?= debian
# Hardening (docs/hardening.md): SANITIZE=address,undefined or SANITIZE=thread runs
# the sanitizer build's tests; `make fuzz FUZZ_SECONDS=N` runs each fuzz target.
SANITIZE     ?=
FUZZ_SECONDS ?= 60
SAN_LABELS   ?= $(if $(filter thread,$(SANITIZE)),collective|data|e2e,backend|data|train|collective|e2e)
SAN_DIR       = $(if $(filter thread,$(SANITIZE)),build-tsan,build-asan)
# Only what those labels run (tests of other labels show up as *_NOT_BUILT, unlabelled).
SAN_TARGETS   = rd_keep_dso rd_no_flock resnet_ddp message_passing test_data data_probe collective_test peer_loss \
                nccl_collective_test ddp_equivalence_test \
                $(if $(filter thread,$(SANITIZE)),,test_backend_reference test_backend_cpu test_backend_faults \
                  test_backend_cpu_bf16 test_backend_winograd train_step_bench test_train test_tensorboard test_resume_plan test_scheduler test_mixing optim_driver sched_driver ema_driver mix_probe pth_dump fuzz_image fuzz_packed fuzz_checkpoint fuzz_flags fuzz_safetensors fuzz_pth)
# In CI (CI set) `make test` also runs the ASan+UBSan build on SAN_LABELS and a fuzz smoke
# of CI_FUZZ_SECONDS per target after the suite (docs/hardening.md); CI_SANITIZE= skips both.
# Measured on 2 cores: the sanitizer labels run 8.6 min (518 s, 98 tests), plus the clang build.
CI_SANITIZE     ?= 1
CI_FUZZ_SECONDS ?= 20

# Exactly what building, testing and the demo need (CUDA comes from NVIDIA's toolkit, not here).
DEB_BUILD   = g++ make cmake pkg-config libopenmpi-dev openmpi-bin libhdf5-dev hdf5-tools \
              libstb-dev libjpeg62-turbo-dev catch2 libdnnl-dev zlib1g-dev libyaml-cpp-dev \
              libtiff-dev libwebp-dev libssl-dev
DEB_RUNTIME = python3 python3-venv python3-numpy python3-torch python3-torchvision python3-h5py python3-pil \
              dataset-fashion-mnist slurm-wlm munge gnuplot-nox procps shellcheck \
              iproute2 iptables ethtool ccache
DEB_PACKAGES = $(DEB_BUILD) $(DEB_RUNTIME)
# Sanitizer and fuzz builds only (clang with libFuzzer, ASan/UBSan/TSan runtimes, LLVM OpenMP).
DEB_HARDEN  = clang libclang-rt-14-dev libomp-dev

.PHONY: all build deps deps-harden test test-isa test-sanitize fuzz san-build run demo clean install bench bench-quick gpu-bundle

all: build

build: $(BUILD_DIR)/CMakeCache.txt
	cmake --build $(BUILD_DIR) -j $(JOBS)
	@for p in resnet_ddp message_passing; do \
	  if [ -x $(BUILD_DIR)/$$p ]; then ln -sf $(BUILD_DIR)/$$p ./$$p; fi; done

# ccache, where present (`make deps` installs it), compiles through a cache: a rebuild, and
# the second build that ctest build_deps_without_optional makes beside this one, take
# seconds. Paths under the checkout are hashed relative to it, so sibling build folders
# (and clones elsewhere) share the objects. CCACHE= turns it off.
CCACHE ?= $(shell command -v ccache 2>/dev/null)
LAUNCHER_ARGS = $(if $(CCACHE),-DCMAKE_C_COMPILER_LAUNCHER=$(CCACHE) -DCMAKE_CXX_COMPILER_LAUNCHER=$(CCACHE) \
                  -DCMAKE_CUDA_COMPILER_LAUNCHER=$(CCACHE))
export CCACHE_BASEDIR ?= $(CURDIR)

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release -DRESNET_DDP_CUDA=$(CUDA) \
	  -DRESNET_DDP_WERROR=$(WERROR) $(LAUNCHER_ARGS) $(CMAKE_ARGS)

# Idempotent: installs only the packages that are missing. Then the small venv with PyPI's
# tensorboard and safetensors on top of Debian's torch (bookworm packages neither), which
# e2e_tensorboard and e2e_safetensors_export use; without network it is reported and those
# tests are skipped, nothing else needs it.
deps:
	@$(MAKE) --no-print-directory install-debs DEBS="$(DEB_PACKAGES)"
	@tools/py_venv.sh >/dev/null || echo "deps: warning: tools/py_venv.sh failed; e2e_tensorboard and e2e_safetensors_export will be skipped"
deps-harden:
	@$(MAKE) --no-print-directory install-debs DEBS="$(DEB_HARDEN)"
install-debs:
	@missing=""; for p in $(DEBS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then echo "deps: all Debian packages present"; else \
	  echo "deps: installing$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends $$missing; \
	fi

# Each stage is timed (tools/stage_time.sh); the table is printed at the end, failed or not.
STAGE_TIMES = $(BUILD_DIR)/stage_times.txt
ifeq ($(SANITIZE),)
test:
	@rm -f $(STAGE_TIMES); \
	tools/stage_time.sh $(STAGE_TIMES) deps $(MAKE) --no-print-directory deps && \
	tools/stage_time.sh $(STAGE_TIMES) build $(MAKE) --no-print-directory build && \
	tools/stage_time.sh $(STAGE_TIMES) ctest sh -c 'cd $(BUILD_DIR) && ctest --output-on-failure -j 2 --timeout 900' && \
	if [ -n "$(CI)" ] && [ -n "$(CI_SANITIZE)" ]; then \
	  tools/stage_time.sh $(STAGE_TIMES) sanitizer-build $(MAKE) --no-print-directory san-build SANITIZE=address,undefined && \
	  tools/stage_time.sh $(STAGE_TIMES) sanitizer-tests ./tools/sanitize/run_ctest.sh $(SAN_DIR) '$(SAN_LABELS)' && \
	  tools/stage_time.sh $(STAGE_TIMES) fuzz-smoke $(MAKE) --no-print-directory fuzz SANITIZE= FUZZ_SECONDS=$(CI_FUZZ_SECONDS); fi; \
	rc=$$?; tools/stage_time.sh --report $(STAGE_TIMES); exit $$rc
else
test: test-sanitize
endif

# The sanitizer build (clang, CPU backend; the ASan one also builds the fuzz targets),
# through ccache like the main build: cold it is CI's longest stage (14.5 CPU-minutes),
# from the cache 42 CPU-seconds.
san-build: deps deps-harden
	@if [ ! -f $(SAN_DIR)/CMakeCache.txt ]; then \
	  CC=clang CXX=clang++ cmake -S . -B $(SAN_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRESNET_DDP_CUDA=OFF \
	    -DRESNET_DDP_NATIVE=OFF -DRESNET_DDP_WERROR=$(WERROR) \
	    -DRESNET_DDP_SANITIZE=$(or $(SANITIZE),address$(,)undefined) \
	    -DRESNET_DDP_FUZZ=$(if $(filter thread,$(SANITIZE)),OFF,ON) $(LAUNCHER_ARGS) $(CMAKE_ARGS); \
	else cmake $(LAUNCHER_ARGS) $(SAN_DIR) >/dev/null; fi  # re-read the CMakeLists: targets may have been renamed
	cmake --build $(SAN_DIR) -j $(JOBS) --target $(SAN_TARGETS)

test-sanitize: san-build
	./tools/sanitize/run_ctest.sh $(SAN_DIR) '$(SAN_LABELS)'

# Fuzz targets live in the ASan+UBSan build directory.
fuzz:
	$(MAKE) --no-print-directory san-build SANITIZE=address,undefined
	./tools/fuzz/run.sh build-asan $(FUZZ_SECONDS)

# The backend, model and parity tests again with oneDNN capped to the ISA classes users
# have (AVX2: AMD Milan, Intel Haswell/Broadwell; AVX512_CORE: Skylake-SP, Zen4 without
# bf16 use). A cap above this CPU's own ISA changes nothing.
TEST_ISAS ?= AVX2 AVX512_CORE
test-isa: deps
	$(MAKE) build
	cd $(BUILD_DIR) && for isa in $(TEST_ISAS); do \
	  echo "== ctest -L 'backend|model|parity' with DNNL_MAX_CPU_ISA=$$isa"; \
	  DNNL_MAX_CPU_ISA=$$isa ctest --output-on-failure -j 2 --timeout 900 -L 'backend|model|parity' || exit 1; \
	done

run: deps
	$(MAKE) build
	$(MAKE) demo

demo:
	./tools/demo.sh

bench: build
	./bench/run_bench.sh --torch $(TORCH)

bench-quick: build
	./bench/run_bench.sh --quick --torch $(TORCH)

# Everything a GPU host without package access needs, in bundle/gpu (see docs/cuda.md).
gpu-bundle:
	./tools/gpu_bundle.sh

install: build
	cmake --install $(BUILD_DIR) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD_DIR) $(BUILD_DIR)-no-optional build-asan build-tsan ./resnet_ddp ./message_passing
