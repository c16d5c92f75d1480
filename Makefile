# uvmrec: build, test and run the engine.  `make` builds; `make test` runs the specs.
# Every target first makes sure the Debian packages it needs are there (`make deps`).

PREFIX    ?= /usr/local#               where `make install` puts things
CC        ?= cc#                       C compiler for the engine
NVCC      ?= $(firstword $(wildcard /usr/local/cuda/bin/nvcc) $(shell command -v nvcc 2>/dev/null))#  empty: no CUDA backend
MPICC     ?= mpicc#                    OpenMPI's compiler driver (make deps installs it); empty: no MPI plugin
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90#  GPU targets (Hopper code and PTX; add compute_80,code=sm_80 for Ampere)
BUILD     ?= $(if $(filter 1,$(SAN)),build-san,build)#                    where objects and libraries go
LUAJIT    ?= luajit#                   interpreter for specs and scripts
SAN       ?=#                          1: build with address and undefined-behaviour sanitizers
WERROR    ?= 1#                        1: warnings are errors
SPEC      ?= spec#                     specs to run (a folder or files)
PYTHON    ?= python3#                  the Python that make pydeps puts a build/venv on
TORCH_INDEX ?=#                        make pydeps-torch: a wheel index besides PyPI (the CPU-only wheel)

ifeq ($(CC),cc)
  CC := gcc
endif

comma    := ,
WARN     := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wno-unused-parameter $(if $(filter 1,$(WERROR)),-Werror)
# float-cast-overflow: gcc's undefined leaves out float-to-integer conversions past the type
SANFLAGS := $(if $(filter 1,$(SAN)),-fsanitize=address$(comma)undefined$(comma)float-cast-overflow -fno-omit-frame-pointer)
CFLAGS_ENGINE := -std=c11 -O2 -g -ffp-contract=off -fPIC -fvisibility=hidden -pthread -D_GNU_SOURCE $(WARN) $(SANFLAGS) \
                 -Iengine/include -Iengine/src
# "sm_80 sm_90 compute_90" from CUDA_ARCH's code= parts, for `uvmrec --version`.
CUDA_ARCH_NAMES := $(patsubst code=%,%,$(filter code=%,$(subst $(comma), ,$(CUDA_ARCH))))
NVFLAGS  := -O3 -std=c++17 $(CUDA_ARCH) -DUR_CUDA_ARCHS='"$(CUDA_ARCH_NAMES)"' -Iengine/include -Iengine/src -Ikernels \
            -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra$(if $(filter 1,$(WERROR)),$(comma)-Werror)

# Libraries the engine links (a host program linking libuvmrec.a links these too).
ENGINE_LIBS := -lyaml -lopenblas -ljansson -lz -ldl -lpthread -lm
# engine/src/dist/mpi_plugin.c is the MPI plugin, built apart (below).
MPI_PLUGIN_SRC := engine/src/dist/mpi_plugin.c
ENGINE_SRC := $(filter-out $(MPI_PLUGIN_SRC),$(wildcard engine/src/*/*.c))
ENGINE_OBJ := $(ENGINE_SRC:engine/src/%.c=$(BUILD)/obj/%.o)
CUDA_SRC   := $(wildcard kernels/*.cu)
CUDA_OBJ   := $(patsubst %.cu,$(BUILD)/cuobj/%.o,$(CUDA_SRC))
LIBS       := $(BUILD)/lib/libuvmrec.a $(BUILD)/lib/libuvmrec.so \
              $(if $(and $(NVCC),$(CUDA_SRC)),$(BUILD)/lib/libuvmrec_cuda.so) \
              $(if $(MPICC),$(BUILD)/lib/libuvmrec_mpi.so)
HOST_BINS  := $(BUILD)/bin/uvmrec $(BUILD)/lib/libuvmrec_lua.a $(BUILD)/lib/libuvmrec_lua.so
CDEF       := lua/uvmrec/cdef.lua
DEPS_STAMP := $(BUILD)/.deps

DEBIAN_PKGS := luajit zlib1g-dev clang libclang-rt-14-dev libluajit-5.1-dev lua-argparse lua-busted lua-check libyaml-dev libopenblas-dev \
               libedit-dev libjansson-dev pkg-config valgrind openmpi-bin libopenmpi-dev

LUA_PATH_TREE  := $(CURDIR)/lua/?.lua;$(CURDIR)/lua/?/init.lua;;
LUA_CPATH_TREE := $(CURDIR)/$(BUILD)/lib/?.so;;
RUN_ENV := LUA_PATH='$(LUA_PATH_TREE)' LUA_CPATH='$(LUA_CPATH_TREE)' UVMREC_BIN='$(abspath $(BUILD))/bin/uvmrec'
# LuaJIT itself is not instrumented: a sanitized engine needs the runtimes preloaded.  An
# allocation too large for the host returns NULL under ASan as without it, so the engine's
# out-of-memory errors are the ones checked (a rank's OOM in spec/dist/faults_spec.lua).
ifeq ($(SAN),1)
  RUN_ENV += LD_PRELOAD="$(shell $(CC) -print-file-name=libasan.so):$(shell $(CC) -print-file-name=libubsan.so)" \
             ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 \
             UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
endif

.PHONY: all deps test test-gpu lint run clean env examples install uninstall dist
all: $(LIBS) $(HOST_BINS) $(CDEF)
	@echo "built: $(LIBS) $(HOST_BINS)"
	@echo "for plain luajit:"
	@$(MAKE) -s --no-print-directory env

env:
	@echo "export LUA_PATH='$(LUA_PATH_TREE)' LUA_CPATH='$(LUA_CPATH_TREE)'"

# Installs only what is missing, non-interactively; a stamp keeps later runs quick.
deps: $(DEPS_STAMP)
$(DEPS_STAMP): Makefile
	@missing=""; for p in $(DEBIAN_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "deps: installing$$missing"; \
	  sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	  $$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null || exit 1; \
	fi
	@mkdir -p $(BUILD) && touch $@

$(BUILD)/obj/%.o: engine/src/%.c engine/include/uvmrec.h $(wildcard engine/src/*/*.h) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ENGINE) -c $< -o $@

# Made anew each time: `ar r` into an old archive would keep objects of files since moved.
$(BUILD)/lib/libuvmrec.a: $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/lib/libuvmrec.so: $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) -shared $(SANFLAGS) -pthread -o $@ $^ $(ENGINE_LIBS)

$(BUILD)/cuobj/%.o: %.cu engine/include/uvmrec.h $(wildcard engine/src/*/*.h kernels/*.cuh) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

# The CUDA runtime is linked statically, so the library needs only the driver on a GPU host.
$(BUILD)/lib/libuvmrec_cuda.so: $(CUDA_OBJ)
	@mkdir -p $(dir $@)
	$(NVCC) -shared --cudart static $(CUDA_ARCH) -o $@ $^ -ldl -lpthread

# The MPI plugin: the engine opens it at run time, so only jobs started by mpirun need MPI.
$(BUILD)/lib/libuvmrec_mpi.so: $(MPI_PLUGIN_SRC) engine/src/dist/comm.h engine/src/core/backend.h engine/include/uvmrec.h | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS_ENGINE) -shared -o $@ $<

# Host programs on the C API alone, linked statically to the engine so they run on a GPU host.
examples: $(BUILD)/bin/uvm_migration $(BUILD)/bin/serve $(BUILD)/bin/serve_bench
# The examples take the engine's libraries statically where the system has the archives (as
# bin/uvmrec does), so make dist's bin/serve and bin/serve_bench run on a host without them.
$(BUILD)/bin/%: engine/examples/%.c $(BUILD)/lib/libuvmrec.a
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -g $(WARN) $(SANFLAGS) -pthread -Iengine/include $< $(BUILD)/lib/libuvmrec.a $(engine_static) $(SYS_LIBS) -o $@

# The C API called with NULL pointers (spec/capi_null_spec.lua): a program made from the header's
# prototypes by spec/support/capi.lua, so a new function is called too.
CAPI_NULLS := $(BUILD)/bin/capi_nulls
$(BUILD)/gen/capi_nulls.c: engine/include/uvmrec.h engine/include/uvmrec_lua.h spec/support/capi.lua | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(LUAJIT) spec/support/capi.lua engine/include/uvmrec.h engine/include/uvmrec_lua.h > $@.tmp && mv $@.tmp $@
$(CAPI_NULLS): $(BUILD)/gen/capi_nulls.c $(BUILD)/lib/libuvmrec.a
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O1 -g -D_GNU_SOURCE $(WARN) $(SANFLAGS) -Iengine/include $< $(BUILD)/lib/libuvmrec.a \
	  $(ENGINE_LIBS) -o $@

# The name comparisons matching a request's keys to a model's features (spec/serve/key_order_spec.lua):
# the engine linked with strcmp wrapped, so each one is counted.
KEY_ORDER := $(BUILD)/bin/key_order
$(KEY_ORDER): spec/support/key_order.c $(BUILD)/lib/libuvmrec.a
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O1 -g -D_GNU_SOURCE $(WARN) $(SANFLAGS) -Iengine/include -Iengine/src $< \
	  $(BUILD)/lib/libuvmrec.a -Wl,--wrap=strcmp $(ENGINE_LIBS) -o $@

# The backend calls ur_cache_drop makes (spec/cache_spec.lua): the engine linked with ur__cpu
# wrapped, so the CPU backend's fill and zero_rows are counted.
CACHE_DROP := $(BUILD)/bin/cache_drop
$(CACHE_DROP): spec/support/cache_drop.c $(BUILD)/lib/libuvmrec.a
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O1 -g -D_GNU_SOURCE $(WARN) $(SANFLAGS) -Iengine/include -Iengine/src $< \
	  $(BUILD)/lib/libuvmrec.a -Wl,--wrap=ur__cpu $(ENGINE_LIBS) -o $@

# Whether an updating mc remap on the CPU asks for memory once its rounds ran (spec/mc_spec.lua):
# the engine linked with ur__cpu, malloc and calloc wrapped, every allocation failing from the
# end of a round to the end of the batch's remap.
MC_OOM := $(BUILD)/bin/mc_oom
$(MC_OOM): spec/support/mc_oom.c $(BUILD)/lib/libuvmrec.a
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O1 -g -D_GNU_SOURCE $(WARN) $(SANFLAGS) -Iengine/include -Iengine/src $< \
	  $(BUILD)/lib/libuvmrec.a -Wl,--wrap=ur__cpu -Wl,--wrap=malloc -Wl,--wrap=calloc $(ENGINE_LIBS) -o $@

# A served model's allocations refused (spec/serve_spec.lua): the engine linked with
# posix_memalign (the CPU backend's allocator) wrapped, every allocation over a limit failing,
# and malloc, calloc and strdup too, the k-th allocation of a call failing.
MODEL_OOM := $(BUILD)/bin/model_oom
$(MODEL_OOM): spec/support/model_oom.c $(BUILD)/lib/libuvmrec.a
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O1 -g -D_GNU_SOURCE $(WARN) $(SANFLAGS) -Iengine/include -Iengine/src $< \
	  $(BUILD)/lib/libuvmrec.a -Wl,--wrap=posix_memalign -Wl,--wrap=malloc -Wl,--wrap=calloc \
	  -Wl,--wrap=strdup $(ENGINE_LIBS) -o $@

# The FFI declarations come from the marked blocks of the public header and of the Lua host's
# header (its support functions), so they cannot drift.
$(CDEF): engine/include/uvmrec.h engine/include/uvmrec_lua.h
	@{ echo "-- Generated by make from engine/include/uvmrec.h and uvmrec_lua.h; do not edit."; \
	   echo "return [==["; \
	   awk '/^\/\* UR_CDEF_BEGIN \*\/$$/{f=1;next} /^\/\* UR_CDEF_END \*\/$$/{f=0} f' $^ | sed -e 's/^UR_API //'; \
	   echo "]==]"; } > $@.tmp && mv $@.tmp $@

# ---- The uvmrec command (LuaJIT and the engine in one program), the Lua embedding library
# (libuvmrec_lua: engine/include/uvmrec_lua.h), install and the relocatable dist/ tree.
SYSLIB      := /usr/lib/$(shell $(CC) -print-multiarch 2>/dev/null)
LUAJIT_INC  := /usr/include/luajit-2.1
HOST_OBJ    := $(BUILD)/obj-host/lua_host.o $(BUILD)/obj-host/repl.o
CFLAGS_HOST := $(CFLAGS_ENGINE) -I$(LUAJIT_INC) -DUR_HOST_CUDA_ARCHS='"$(if $(filter %cuda.so,$(LIBS)),$(CUDA_ARCH_NAMES))"'
# Linked into the command statically where the .a is there (checked when linking, after `deps`),
# so it runs on hosts that have none of them: LuaJIT, libedit and what it needs, and the engine's
# libraries but glibc's.
ENGINE_STATIC := $(patsubst -l%,%,$(filter-out -ldl -lpthread -lm -lrt,$(ENGINE_LIBS)))
LUA_STATIC    := luajit-5.1 edit tinfo bsd md
SYS_LIBS      := $(filter -ldl -lpthread -lm -lrt,$(ENGINE_LIBS))
# $(call static,LIBS): each library's archive where the system has it, else -lLIB.
static = $$(for l in $(1); do a=$(SYSLIB)/lib$$l.a; if [ -f $$a ]; then printf '%s ' $$a; else printf -- '-l%s ' $$l; fi; done)
engine_static = $(call static,$(ENGINE_STATIC))
host_static   = $(call static,$(LUA_STATIC) $(ENGINE_STATIC))
VERSION      = $(shell sed -n 's/^\#define UR_VERSION "\(.*\)"/\1/p' engine/include/uvmrec.h)

$(BUILD)/obj-host/%.o: engine/host/%.c engine/host/host.h engine/include/uvmrec_lua.h engine/include/uvmrec.h | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_HOST) -c $< -o $@

$(BUILD)/lib/libuvmrec_lua.a: $(HOST_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/lib/libuvmrec_lua.so: $(HOST_OBJ) $(BUILD)/lib/libuvmrec.so
	$(CC) -shared $(SANFLAGS) -pthread -o $@ $(HOST_OBJ) -L$(BUILD)/lib -luvmrec -lluajit-5.1 -ledit -Wl,-rpath,'$$ORIGIN'

# The whole engine goes in and its ur_* functions are exported with Lua's API (uvmrec.syms), so
# the FFI finds the engine in the program itself and Lua C modules find lua_*.
$(BUILD)/bin/uvmrec: $(BUILD)/obj-host/main.o $(HOST_OBJ) $(BUILD)/lib/libuvmrec.a engine/host/uvmrec.syms
	@mkdir -p $(dir $@)
	$(CC) $(SANFLAGS) -pthread -o $@ $(BUILD)/obj-host/main.o $(HOST_OBJ) \
	  -Wl,--whole-archive $(BUILD)/lib/libuvmrec.a -Wl,--no-whole-archive \
	  -Wl,--dynamic-list=engine/host/uvmrec.syms $(host_static) $(SYS_LIBS)

define UVMREC_PC
prefix=$(PREFIX)
libdir=$${prefix}/lib
includedir=$${prefix}/include

Name: uvmrec
Description: uvmrec engine: tensors in unified memory steered by hints (C API, no Lua)
Version: $(VERSION)
Cflags: -I$${includedir}
Libs: -L$${libdir} -luvmrec
Libs.private: $(ENGINE_LIBS)
endef
define UVMREC_LUA_PC
prefix=$(PREFIX)
libdir=$${prefix}/lib
includedir=$${prefix}/include

Name: uvmrec-lua
Description: uvmrec engine with its Lua face embedded in a host program (uvmrec_lua.h)
Version: $(VERSION)
Requires: uvmrec luajit
Requires.private: libedit
Cflags: -I$${includedir}
Libs: -L$${libdir} -luvmrec_lua
endef
export UVMREC_PC UVMREC_LUA_PC

INST := $(DESTDIR)$(PREFIX)
install: all
	install -d $(INST)/bin $(INST)/lib/pkgconfig $(INST)/include $(INST)/share/lua/5.1 $(INST)/share/uvmrec
	install -m 755 $(BUILD)/bin/uvmrec $(INST)/bin/
	install -m 644 $(BUILD)/lib/libuvmrec.a $(BUILD)/lib/libuvmrec_lua.a $(INST)/lib/
	install -m 755 $(filter %.so,$(LIBS) $(HOST_BINS)) $(INST)/lib/
	install -m 644 engine/include/uvmrec.h engine/include/uvmrec_lua.h $(INST)/include/
	rm -rf $(INST)/share/lua/5.1/uvmrec $(INST)/share/uvmrec/scripts $(INST)/share/uvmrec/models
	cp -R lua/uvmrec $(INST)/share/lua/5.1/
	cp -R scripts models $(INST)/share/uvmrec/
	printf '%s\n' "$$UVMREC_PC" > $(INST)/lib/pkgconfig/uvmrec.pc
	printf '%s\n' "$$UVMREC_LUA_PC" > $(INST)/lib/pkgconfig/uvmrec-lua.pc

uninstall:
	rm -f $(INST)/bin/uvmrec $(addprefix $(INST)/include/,uvmrec.h uvmrec_lua.h) \
	  $(addprefix $(INST)/lib/,libuvmrec.a libuvmrec.so libuvmrec_cuda.so libuvmrec_mpi.so libuvmrec_lua.a libuvmrec_lua.so) \
	  $(addprefix $(INST)/lib/pkgconfig/,uvmrec.pc uvmrec-lua.pc)
	rm -rf $(INST)/share/lua/5.1/uvmrec $(INST)/share/uvmrec

# lua-argparse (uvmrec.cli's parser), busted and what it loads (Lua files and three small C
# modules) travel in the dist tree, which runs the command and the spec suite where only the
# NVIDIA driver is installed.
DIST_LUA   := argparse.lua busted busted.lua luassert say pl cliargs cliargs.lua mediator.lua dkjson.lua term system
DIST_CMODS := lfs.so term/core.so system/core.so
DIST_MAX_MIB := 48
# The tree's programs (bin/uvmrec, bin/serve, bin/serve_bench) share one engine, lib/libuvmrec.so,
# so OpenBLAS (its kernels for every CPU are most of the tree) is there once. The engine holds
# libyaml and OpenBLAS linked in and hidden; Debian's libjansson.a and libz.a are not
# position-independent, so a copy of libjansson travels beside it and libz.so.1 (on every glibc
# system) is the host's. The programs find the engine through their run path.
DIST_ENGINE := $(BUILD)/dist/libuvmrec.so
DIST_BINS   := $(BUILD)/dist/uvmrec $(BUILD)/dist/serve $(BUILD)/dist/serve_bench
DIST_SHARED := jansson z
DIST_COPIED := libjansson.so.4
DIST_LINK   := -L$(BUILD)/dist -luvmrec -Wl,-rpath,'$$ORIGIN/../lib'
$(DIST_ENGINE): $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) -shared $(SANFLAGS) -pthread -Wl,-soname,libuvmrec.so -Wl,--exclude-libs,ALL -Wl,-rpath,'$$ORIGIN' -o $@ $^ \
	  $(call static,$(filter-out $(DIST_SHARED),$(ENGINE_STATIC))) $(addprefix -l,$(DIST_SHARED)) $(SYS_LIBS)
$(BUILD)/dist/uvmrec: $(BUILD)/obj-host/main.o $(HOST_OBJ) $(DIST_ENGINE) engine/host/uvmrec.syms
	$(CC) $(SANFLAGS) -pthread -o $@ $(BUILD)/obj-host/main.o $(HOST_OBJ) $(DIST_LINK) \
	  -Wl,--dynamic-list=engine/host/uvmrec.syms $(call static,$(LUA_STATIC)) $(SYS_LIBS)
$(BUILD)/dist/%: engine/examples/%.c $(DIST_ENGINE)
	$(CC) -std=c11 -O2 -g $(WARN) $(SANFLAGS) -pthread -Iengine/include $< $(DIST_LINK) $(SYS_LIBS) -o $@

# The spec suite's C programs that check a GPU (engine/tests/): a dist tree has no sources to build
# them with, so they travel built, in its spec/bin/, where spec/support/helpers.lua's build_c
# finds them.
DIST_CHECKS := $(BUILD)/dist/checks/read_threads
$(BUILD)/dist/checks/%: engine/tests/%.c $(DIST_ENGINE)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -g $(WARN) $(SANFLAGS) -pthread -Iengine/include $< -L$(BUILD)/dist -luvmrec \
	  -Wl,-rpath,'$$ORIGIN/../../lib' $(SYS_LIBS) -o $@

# Where CUDA is built, the tree also carries bin/lt_epilogues: which cuBLASLt epilogues the GPU's
# cuBLASLt offers for DLRM's MLP products, and their cost (docs/dense.md);
# bin/link_interference: what rows moved over the host link cost the products beside them
# (docs/uvm.md); and lib/libktrace.so, a kernel timeline through CUDA's injection hook
# (docs/benchmarks.md).
DIST_CUDA_BINS := $(if $(filter %cuda.so,$(LIBS)),$(BUILD)/dist/lt_epilogues $(BUILD)/dist/link_interference)
# (libktrace.so only where the toolkit has CUPTI; it finds libcupti where it was built.)
CUPTI_LIB := $(firstword $(wildcard $(dir $(NVCC))../lib64/libcupti.so $(dir $(NVCC))../lib/libcupti.so))
DIST_CUDA_LIBS := $(if $(and $(filter %cuda.so,$(LIBS)),$(CUPTI_LIB)),$(BUILD)/dist/libktrace.so)
$(BUILD)/dist/libktrace.so: scripts/bench/ktrace.c
	@mkdir -p $(dir $@)
	$(NVCC) -O2 -shared -Xcompiler -fPIC,-Wall,-Wextra,-Werror -Xlinker -rpath,$(abspath $(dir $(CUPTI_LIB))) \
	  -o $@ $< -lcupti
$(BUILD)/dist/lt_epilogues: scripts/bench/lt_epilogues.cu scripts/bench/bench_cuda.h
	@mkdir -p $(dir $@)
	$(NVCC) -O2 $(CUDA_ARCH) -Werror all-warnings -o $@ $< -lcublasLt
$(BUILD)/dist/link_interference: scripts/bench/link_interference.cu scripts/bench/bench_cuda.h
	@mkdir -p $(dir $@)
	$(NVCC) -O3 $(CUDA_ARCH) -Werror all-warnings -o $@ $< -lcublas

dist: all $(DIST_BINS) $(DIST_CHECKS) $(DIST_CUDA_BINS) $(DIST_CUDA_LIBS)
	rm -rf dist && mkdir -p dist/bin dist/lib/lua/term dist/lib/lua/system dist/lua
	cp $(DIST_BINS) $(DIST_CUDA_BINS) dist/bin/ && cp $(DIST_ENGINE) $(addprefix $(SYSLIB)/,$(DIST_COPIED)) dist/lib/
	strip --strip-debug $(addprefix dist/bin/,$(notdir $(DIST_BINS))) dist/lib/libuvmrec.so
	$(if $(filter %cuda.so,$(LIBS)),cp $(filter %cuda.so,$(LIBS)) $(DIST_CUDA_LIBS) dist/lib/)
	$(if $(filter %mpi.so,$(LIBS)),cp $(filter %mpi.so,$(LIBS)) dist/lib/)
	cp -R lua/uvmrec dist/lua/
	for m in $(DIST_LUA); do cp -RL /usr/share/lua/5.1/$$m dist/lua/ || exit 1; done
	for m in $(DIST_CMODS); do cp -L $(SYSLIB)/lua/5.1/$$m dist/lib/lua/$$m || exit 1; done
	cp -R scripts spec README.md dist/
	mkdir -p dist/spec/bin && cp $(DIST_CHECKS) dist/spec/bin/
	if [ -d models ]; then cp -R models dist/; fi
	{ echo "uvmrec $(VERSION): a self-contained tree made by make dist ($$(git describe --always --dirty 2>/dev/null || echo no git), $$(date -u +%F))."; \
	  echo "bin/uvmrec uses only the Lua modules and libraries in this tree, never the system's."; \
	  echo "CUDA: $(if $(filter %cuda.so,$(LIBS)),lib/libuvmrec_cuda.so for $(CUDA_ARCH_NAMES),not built)."; \
	  echo "MPI: $(if $(filter %mpi.so,$(LIBS)),lib/libuvmrec_mpi.so (used where OpenMPI is installed; NCCL is never shipped),not built)."; \
	  echo "Spec suite: bin/uvmrec test; on a GPU host, only the GPU specs: bin/uvmrec test --gpu"; } > dist/DIST
	@mib=$$(du -sm dist | cut -f1); echo "dist: $$mib MiB in dist/"; \
	  [ $$mib -le $(DIST_MAX_MIB) ] || { echo "dist: over $(DIST_MAX_MIB) MiB"; exit 1; }

test: all $(CAPI_NULLS) $(KEY_ORDER) $(CACHE_DROP) $(MC_OOM) $(MODEL_OOM) fuzz-build
	@$(RUN_ENV) $(LUAJIT) spec/run.lua $(SPEC)

test-gpu: all
	@$(RUN_ENV) UVMREC_REQUIRE_GPU=1 $(LUAJIT) spec/run.lua --tags=cuda $(SPEC)

# Benchmarks (BENCH.md): each prints a table and writes JSON lines into $(BUILD)/bench/.
# bench-gpu runs PyTorch's nn.EmbeddingBag first where PyTorch is installed (build/venv's, from
# make pydeps-torch, else $(PYTHON)'s), for the ratios.
.PHONY: bench bench-gpu
bench: all
	@mkdir -p $(BUILD)/bench
	@$(RUN_ENV) $(LUAJIT) scripts/bench/tbe.lua --cpu --out $(BUILD)/bench/tbe_cpu.jsonl
	@$(RUN_ENV) $(LUAJIT) scripts/bench/mlp.lua --cpu --out $(BUILD)/bench/mlp_cpu.jsonl

bench-gpu: all
	@mkdir -p $(BUILD)/bench
	@$(VENV_PYTHON) scripts/bench/torch_embeddingbag.py --out $(BUILD)/bench/torch_embeddingbag.jsonl || \
	  echo "bench-gpu: the PyTorch comparison failed; the ratios are left out"
	@$(RUN_ENV) $(LUAJIT) scripts/bench/tbe.lua --gpu --torch $(BUILD)/bench/torch_embeddingbag.jsonl \
	  --out $(BUILD)/bench/tbe_gpu.jsonl
	@$(VENV_PYTHON) scripts/bench/torch_mlp.py --out $(BUILD)/bench/torch_mlp.jsonl || \
	  echo "bench-gpu: the PyTorch MLP comparison failed; its ratios are left out"
	@$(RUN_ENV) $(LUAJIT) scripts/bench/mlp.lua --gpu --torch $(BUILD)/bench/torch_mlp.jsonl \
	  --out $(BUILD)/bench/mlp_gpu.jsonl

lint: $(DEPS_STAMP)
	luacheck -q lua spec scripts $(wildcard models)

# Optional Python tools from PyPI, at the exact versions of scripts/requirements*.txt, in
# build/venv (the specs and benches look there first; UVMREC_PYTHON names another Python):
#   make pydeps        safetensors and numpy: the checkpoint interop spec and
#                      scripts/bench/read_safetensors.py (without them that spec is pending)
#   make pydeps-torch  those and PyTorch: spec/models/torch_parity_spec.lua, scripts/bench/torch_*.py,
#                      torch_compare.sh and bench-gpu's ratios.  PyPI's wheel is the CUDA build
#                      (a few GB with its CUDA libraries; it runs on the CPU too); with
#                      TORCH_INDEX=https://download.pytorch.org/whl/cpu the same version's CPU-only
#                      wheel comes from there instead, where that index can be reached.
VENV        := build/venv
VENV_PYTHON  = $(if $(wildcard $(VENV)/bin/python),$(VENV)/bin/python,$(PYTHON))
.PHONY: pydeps pydeps-torch
pydeps: $(VENV)/.pydeps
pydeps-torch: $(VENV)/.pydeps-torch
$(VENV)/bin/pip:
	$(PYTHON) -m venv $(VENV)
$(VENV)/.pydeps: scripts/requirements.txt | $(VENV)/bin/pip
	$(VENV)/bin/pip install -q -r scripts/requirements.txt && touch $@
$(VENV)/.pydeps-torch: scripts/requirements-torch.txt scripts/requirements.txt | $(VENV)/bin/pip
	$(VENV)/bin/pip install -q -r scripts/requirements-torch.txt $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) \
	  && touch $@ $(VENV)/.pydeps

# The default job: DLRM (models/dlrm_tiny.yaml) on synthetic data, to the final AUC and the data's
# ceiling; on the GPU when there is one.
run: all
	@$(RUN_ENV) $(BUILD)/bin/uvmrec train models/dlrm_tiny.yaml

clean:
	rm -rf $(BUILD) $(CDEF) dist

# Fuzzing: `make fuzz` (FUZZ_SECONDS per target, default 60).
include engine/fuzz/fuzz.mk
# The synthetic generator must round as the CPU does: no fused multiply-adds.
$(BUILD)/cuobj/kernels/synth.o: NVFLAGS += -fmad=false
# Managed collisions' scores (distance_lfu's power) must round as the CPU's do.
$(BUILD)/cuobj/kernels/mc.o: NVFLAGS += -fmad=false
