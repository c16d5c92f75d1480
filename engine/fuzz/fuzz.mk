# libFuzzer targets for every C parser of outside input (engine/fuzz/*.c: TSV lines, .npy
# headers, safetensors files, YAML documents, keyed jagged tensors from raw arrays), each linked
# to the engine built by clang with the address and undefined-behaviour sanitizers.
# `make fuzz` runs each for FUZZ_SECONDS over its corpus (build/fuzz/corpus/NAME, seeded from
# engine/fuzz/seeds/NAME); a crash stops it with the input saved as crash-* in the top folder.
# `make test` builds them and spec/fuzz_spec.lua runs each once over its seeds and corpus.
FUZZ_SECONDS ?= 60#                   how long `make fuzz` runs each target
FUZZ_CC      ?= clang#                a clang with libFuzzer (Debian: clang, libclang-rt-14-dev)
FUZZ_FLAGS   := -std=c11 -O1 -g -fno-omit-frame-pointer -pthread -D_GNU_SOURCE -Iengine/include -Iengine/src
FUZZ_SAN     := address,undefined
FUZZ_BINS    := $(patsubst engine/fuzz/%.c,$(BUILD)/fuzz/%,$(wildcard engine/fuzz/*.c))
FUZZ_OBJ     := $(ENGINE_SRC:engine/src/%.c=$(BUILD)/fuzz/obj/%.o)
.SECONDARY: $(FUZZ_OBJ)

$(BUILD)/fuzz/obj/%.o: engine/src/%.c engine/include/uvmrec.h $(wildcard engine/src/*/*.h) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	@$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link,$(FUZZ_SAN) -c $< -o $@

$(BUILD)/fuzz/%: engine/fuzz/%.c $(FUZZ_OBJ)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer,$(FUZZ_SAN) $^ $(ENGINE_LIBS) -o $@

.PHONY: fuzz fuzz-build
fuzz-build: $(FUZZ_BINS)
fuzz: $(FUZZ_BINS)
	@for b in $(FUZZ_BINS); do n=$$(basename $$b); mkdir -p $(BUILD)/fuzz/corpus/$$n; \
	  echo "== fuzz $$n for $(FUZZ_SECONDS) s"; \
	  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 $$b -max_total_time=$(FUZZ_SECONDS) -timeout=10 \
	    -rss_limit_mb=2048 -print_final_stats=1 $(BUILD)/fuzz/corpus/$$n engine/fuzz/seeds/$$n \
	    > $(BUILD)/fuzz/$$n.log 2>&1; rc=$$?; grep -E '^(#[0-9]+.*DONE|Done|stat::number_of_executed_units)' \
	    $(BUILD)/fuzz/$$n.log; [ $$rc -eq 0 ] || { tail -n 40 $(BUILD)/fuzz/$$n.log; exit $$rc; }; done
