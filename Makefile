# idemproc — build, test, demo. `make help` lists the targets.

CC      ?= cc
PREFIX  ?= /usr/local
BUILD   ?= build
SAN     ?=
VERSION := 0.1.0

# Libraries, found with pkg-config. These variables are recursive (=) on
# purpose: they are expanded when a recipe runs, i.e. after `deps` has
# installed whatever pkg-config could not find.
PKGS      := rdkafka hiredis jansson libmicrohttpd uuid openssl libpq libcurl lua5.1
TEST_PKGS := criterion
PKG_CFLAGS  = $(shell pkg-config --cflags $(PKGS))
PKG_LIBS    = $(shell pkg-config --libs $(PKGS))
TEST_CFLAGS = $(shell pkg-config --cflags $(TEST_PKGS))
TEST_LIBS   = $(shell pkg-config --libs $(TEST_PKGS))

# PostgreSQL server binaries (initdb, pg_ctl, postgres) for the outbox tests.
PG_BINDIR ?= $(or $(lastword $(sort $(wildcard /usr/lib/postgresql/*/bin))),/usr/lib/postgresql/15/bin)

# Debian packages: what building needs, and what the tests, the demo and
# the benchmark need on top (servers and real clients they run).
BUILD_DEB_PKGS := build-essential pkg-config librdkafka-dev libhiredis-dev \
                  libjansson-dev libmicrohttpd-dev uuid-dev libssl-dev libpq-dev \
                  libcurl4-openssl-dev liblua5.1-0-dev
TEST_DEB_PKGS  := libcriterion-dev redis-server redis-tools redis-sentinel \
                  kcat prometheus clang-format jq openssl postgresql
# Fuzzing (make fuzz), the memory checks of CI (.ci/run) and the chart of
# `make bench` on top.
FUZZ_DEB_PKGS  := clang-14 libclang-rt-14-dev
CHECK_DEB_PKGS := valgrind
BENCH_DEB_PKGS := gnuplot-nox
DEB_PKGS       := $(BUILD_DEB_PKGS) $(TEST_DEB_PKGS) $(FUZZ_DEB_PKGS) \
                  $(CHECK_DEB_PKGS) $(BENCH_DEB_PKGS)

WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wwrite-strings -Werror
CFLAGS  ?= -O2 -g
# The sources: processor/main.c and one folder per job under processor/
# (docs/design.md, "The map"); the public plugin header in
# processor/include/. Includes name the folder: #include "redis/store.h".
SRC_DIRS := processor $(addprefix processor/,cmd base conf loop effect \
              handlers input redis kafka outbox obs dev)
INCLUDES := -Iprocessor -Iprocessor/include
ALL_CFLAGS = -std=c11 -D_GNU_SOURCE $(WARN) $(CFLAGS) -MMD -MP \
             -DIDEM_VERSION='"$(VERSION)"' $(INCLUDES) $(PKG_CFLAGS)
LDLIBS_ALL = $(PKG_LIBS) -lpthread -lm -ldl
ifneq ($(SAN),)
ALL_CFLAGS += -fsanitize=$(SAN) -fno-omit-frame-pointer
LDFLAGS    += -fsanitize=$(SAN)
endif

SRCS      := $(wildcard $(SRC_DIRS:%=%/*.c))
# A Lua script a handler runs in Redis is a file of its own beside it
# (processor/handlers/ledger.lua), embedded at build: $(BUILD)/gen/<dir>/
# <name>_lua.c holds it as idem_<name>_lua[] (NUL-terminated) and
# idem_<name>_lua_len, written with od and sed, compiled like the sources.
LUA_SRCS  := $(wildcard $(SRC_DIRS:%=%/*.lua))
OBJS      := $(SRCS:processor/%.c=$(BUILD)/obj/%.o) \
             $(LUA_SRCS:processor/%.lua=$(BUILD)/obj/%_lua.o)
LIB_OBJS  := $(filter-out $(BUILD)/obj/main.o,$(OBJS))
# Tests in three tiers, one Criterion binary each (docs/testing.md):
#   unit  tests/unit: no server, no child process; built without the
#         harness's include path and linked without it, so it cannot
#         start one (make check);
#   it    tests/it: one private redis-server, an in-process server or
#         mock cluster, or a tool (promtool); no idemproc process;
#   e2e   tests/e2e: idemproc processes (members, the stack, the CLI,
#         chaos, the outbox, the README's commands).
# tests/lib (files, parsers) is linked into every tier, tests/harness
# (processes and servers) into it and e2e.
TIERS        := unit it e2e
TESTLIB_SRCS := $(wildcard tests/lib/*.c)
HARNESS_SRCS := $(wildcard tests/harness/*.c)
TIER_SRCS_unit := $(wildcard tests/unit/*.c) $(TESTLIB_SRCS)
TIER_SRCS_it   := $(wildcard tests/it/*.c) $(TESTLIB_SRCS) $(HARNESS_SRCS)
TIER_SRCS_e2e  := $(wildcard tests/e2e/*.c) $(TESTLIB_SRCS) $(HARNESS_SRCS)
tobjs = $(patsubst tests/%.c,$(BUILD)/tobj/%.o,$(1))
TEST_OBJS := $(sort $(foreach t,$(TIERS),$(call tobjs,$(TIER_SRCS_$(t)))))
TIER_BINS := $(TIERS:%=$(BUILD)/idemproc-%)
BIN       := $(BUILD)/idemproc
# The benchmark's webhook service: the tests' scripted HTTP server.
HOOKSINK  := $(BUILD)/hooksink
# The ordering tests' and bench's service: judges the order per key.
ORDERSINK := $(BUILD)/ordersink

# Handler plugins (handler=plugin:PATH.so): each is built from its one
# source and the public header alone (processor/include), never against
# idemproc's objects; -Wl,--no-undefined makes a plugin that reaches for
# an internal symbol fail here rather than at load. The examples go to
# build/plugins, the test plugins (two built for other ABI versions,
# ...) to build/tplugins.
PLUGIN_CFLAGS = -std=c11 $(WARN) $(CFLAGS) -MMD -MP -fPIC -Iprocessor/include
PLUGIN_LDFLAGS = -shared -Wl,--no-undefined
ifneq ($(SAN),)
PLUGIN_CFLAGS  += -fsanitize=$(SAN) -fno-omit-frame-pointer
PLUGIN_LDFLAGS += -fsanitize=$(SAN)
endif
PLUGIN_SRCS      := $(wildcard config/examples/*.c)
PLUGINS          := $(PLUGIN_SRCS:config/examples/%.c=$(BUILD)/plugins/%.so)
# tests/plugins/abi_other.c is built twice, for other ABI versions than
# this idemproc's: abi_v1 (version 1) and abi_next (the next version).
ABI_PLUGIN_SRC   := tests/plugins/abi_other.c
ABI_OF_abi_v1    := 1
ABI_OF_abi_next  := IDEMPROC_PLUGIN_ABI_VERSION+1
ABI_PLUGINS      := $(BUILD)/tplugins/abi_v1.so $(BUILD)/tplugins/abi_next.so
TEST_PLUGIN_SRCS := $(filter-out $(ABI_PLUGIN_SRC),$(wildcard tests/plugins/*.c))
TEST_PLUGINS     := $(TEST_PLUGIN_SRCS:tests/plugins/%.c=$(BUILD)/tplugins/%.so) \
                    $(ABI_PLUGINS)

# Tests build argv arrays from string literals, hence -Wno-write-strings there.
# Criterion options for `make test`; e.g. make test TEST_ARGS='--filter=conf/*'
TEST_JOBS ?= 2
TEST_ARGS ?=

# The test objects need Criterion, which only deps-check-test installs.
.PHONY: all deps deps-check deps-check-test deps-check-fuzz deps-check-bench \
        test check check-includes check-format check-deploy \
        format demo demo-outbox bench chaos chaos-cluster fuzz fuzz-build tsan memcheck clean \
        install help

all: $(BIN) $(PLUGINS)

help:
	@echo "make [all]      build $(BIN) (installs missing Debian packages first)"
	@echo "make check      format and include checks, the unit tier (under a minute)"
	@echo "make test       everything: check, check-deploy, then the it and e2e tiers"
	@echo "make check-deploy  lint the deploy files (rendered overlays, Dockerfile,"
	@echo "                PrometheusRule; needs kubectl) and prove each check can fail"
	@echo "make demo       whole pipeline on the embedded broker and a private redis"
	@echo "make demo-outbox  PostgreSQL outbox -> relay -> processor -> verify"
	@echo "make bench      throughput side by side (kcat, the classic per-message design,"
	@echo "                Redis alone, idemproc with 1 and 2 members), CPU and memory per"
	@echo "                record, latency, produce vs kcat -P, webhook, outbox and member"
	@echo "                (dedup.scope global/partition, 1M-mark load) rows;"
	@echo "                BENCH_ROWS=\"kcat idemproc1 ...\" picks rows, BENCH_REPS repetitions"
	@echo "make chaos      kills, Redis kill -9, broker faults at once; exact or fail"
	@echo "                (CHAOS_SEED, CHAOS_RECORDS, CHAOS_SECONDS)"
	@echo "make chaos-cluster  the same on a 3+3 Redis Cluster (or CHAOS_CLUSTER=1 make"
	@echo "                chaos): primaries kill -9'd and SIGSTOPped, reshards, CLUSTER"
	@echo "                FAILOVER, members killed, stopped, restarted; exact or fail"
	@echo "make fuzz       each libFuzzer target for FUZZ_SECONDS (default 60)"
	@echo "make tsan       ThreadSanitizer: the HTTP thread against the loop's updates"
	@echo "make memcheck   make demo (fewer records) with every process under valgrind"
	@echo "make format     clang-format the sources"
	@echo "make SAN=address,undefined ...   sanitizer build"
	@echo "make deps       install the Debian packages listed in DEB_PKGS"

# deps-check runs before every compile, deps-check-test before the tests,
# the demo and the benchmark: cheap when everything is present, installs
# what is missing otherwise (apt-get, through sudo when not root). A plain
# `make` installs only what building needs.
deps-check:
	@pkg-config --exists $(PKGS) \
	  || $(MAKE) --no-print-directory deps DEB_PKGS="$(BUILD_DEB_PKGS)"

deps-check-test: deps-check
	@pkg-config --exists $(TEST_PKGS) && command -v redis-server >/dev/null \
	  && command -v redis-sentinel >/dev/null \
	  && command -v kcat >/dev/null && command -v promtool >/dev/null \
	  && command -v clang-format >/dev/null && command -v jq >/dev/null \
	  && command -v openssl >/dev/null \
	  && test -x $(PG_BINDIR)/initdb \
	  || $(MAKE) --no-print-directory deps DEB_PKGS="$(TEST_DEB_PKGS)"

deps-check-bench: deps-check-test
	@command -v gnuplot >/dev/null \
	  || $(MAKE) --no-print-directory deps DEB_PKGS="$(BENCH_DEB_PKGS)"

deps-check-fuzz:
	@command -v $(FUZZ_CC) >/dev/null \
	  && ls /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 \
	  || $(MAKE) --no-print-directory deps DEB_PKGS="$(FUZZ_DEB_PKGS)"

deps:
	@missing=""; for p in $(DEB_PKGS); do \
	  dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  sudo=""; if [ "$$(id -u)" -ne 0 ]; then \
	    command -v sudo >/dev/null || { echo "deps: missing$$missing; run 'make deps' as root (no sudo here)" >&2; exit 1; }; \
	    sudo=sudo; fi; \
	  echo "deps: installing$$missing"; \
	  $$sudo apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $$missing; \
	else echo "deps: all Debian packages present"; fi

$(BUILD)/obj $(BUILD)/tobj $(BUILD)/plugins $(BUILD)/tplugins:
	@mkdir -p $@

$(BUILD)/obj/%.o: processor/%.c | deps-check $(BUILD)/obj
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -c -o $@ $<

$(BUILD)/gen/%_lua.c: processor/%.lua
	@mkdir -p $(@D)
	@n=$(notdir $*); { \
	  echo "/* generated by make from processor/$*.lua: edit that file */"; \
	  echo "#include <stddef.h>"; \
	  echo "extern const char idem_$${n}_lua[];"; \
	  echo "extern const size_t idem_$${n}_lua_len;"; \
	  echo "const char idem_$${n}_lua[] = {"; \
	  od -An -v -tx1 $< | sed 's/\([0-9a-f][0-9a-f]\)/0x\1,/g'; \
	  echo "0};"; \
	  echo "const size_t idem_$${n}_lua_len = sizeof(idem_$${n}_lua) - 1;"; \
	} > $@.tmp && mv $@.tmp $@
.PRECIOUS: $(BUILD)/gen/%_lua.c

$(BUILD)/obj/%_lua.o: $(BUILD)/gen/%_lua.c | deps-check $(BUILD)/obj
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -c -o $@ $<

TEST_CFLAGS_ALL = $(ALL_CFLAGS) -Wno-write-strings $(TEST_CFLAGS) -Itests/lib
$(BUILD)/tobj/unit/%.o: tests/unit/%.c | deps-check-test
	@mkdir -p $(@D)
	$(CC) $(TEST_CFLAGS_ALL) -c -o $@ $<

$(BUILD)/tobj/%.o: tests/%.c | deps-check-test
	@mkdir -p $(@D)
	$(CC) $(TEST_CFLAGS_ALL) -Itests/harness -c -o $@ $<

$(BUILD)/plugins/%.so: config/examples/%.c | deps-check $(BUILD)/plugins
	$(CC) $(PLUGIN_CFLAGS) $(PLUGIN_LDFLAGS) -o $@ $<

$(BUILD)/tplugins/%.so: tests/plugins/%.c | deps-check $(BUILD)/tplugins
	$(CC) $(PLUGIN_CFLAGS) $(PLUGIN_LDFLAGS) -o $@ $<

$(ABI_PLUGINS): $(BUILD)/tplugins/%.so: $(ABI_PLUGIN_SRC) | deps-check $(BUILD)/tplugins
	$(CC) $(PLUGIN_CFLAGS) -DABI_VERSION='$(ABI_OF_$*)' -DPLUGIN_NAME='"$*"' \
	  $(PLUGIN_LDFLAGS) -o $@ $<

$(BIN): $(OBJS)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS_ALL)

# A tier's binary: its own objects (TIER_SRCS_<tier>) and the library.
$(foreach t,$(TIERS),$(eval $(BUILD)/idemproc-$(t): \
    $(call tobjs,$(TIER_SRCS_$(t)))))
$(TIER_BINS): $(LIB_OBJS)
	$(CC) $(LDFLAGS) -o $@ $^ $(TEST_LIBS) $(LDLIBS_ALL)
# What the e2e tests run besides themselves (the binary, the README's
# hooksink, the ordering tests' ordersink, the plugins), so that `make
# build/idemproc-e2e` then a --filter run works without `make test`;
# order-only: they do not relink the tests.
$(BUILD)/idemproc-e2e: | $(BIN) $(HOOKSINK) $(ORDERSINK) $(PLUGINS) $(TEST_PLUGINS)

FORMAT_SRCS = $(wildcard $(SRC_DIRS:%=%/*.[ch]) processor/include/*/*.h) \
              $(wildcard tests/*/*.[ch]) \
              $(PLUGIN_SRCS) $(TEST_PLUGIN_SRCS) $(ABI_PLUGIN_SRC)

check-format: | deps-check-test
	@out=$$(clang-format --dry-run --Werror $(FORMAT_SRCS) 2>&1); \
	if [ -n "$$out" ]; then echo "$$out" | head -20; echo "check-format: run 'make format'"; exit 1; fi; \
	echo "check-format: ok"

format: | deps-check-test
	clang-format -i $(FORMAT_SRCS)

# The suite's logs are long; each tier writes a TAP report next to the
# build and, when something fails, the failed tests and their assertions
# are printed again at the very end, where a CI log's tail shows them.
# Every tier runs even when an earlier one failed. A failed test of the it
# or e2e tier is run once more alone (tests/run_tier.sh); one that passes
# then is named at the end as a flake to fix.
TEST_ENV = IDEMPROC_BIN=$(abspath $(BIN)) IDEMPROC_SRC=$(abspath .) \
           PG_BINDIR=$(PG_BINDIR) \
           LSAN_OPTIONS=suppressions=$(abspath tests/lsan.supp)
# $(call run_tiers,TIER ...): runs each tier's binary, then reports.
define run_tiers
	@rc=0; failed=""; rm -f $(BUILD)/test-flaky.txt; for t in $(1); do \
	  echo "test: --- tier $$t"; \
	  $(TEST_ENV) tests/run_tier.sh $(BUILD) $$t $(TEST_JOBS) \
	    $(TEST_ARGS) || { rc=1; failed="$$failed $$t"; }; \
	done; \
	if [ -s $(BUILD)/test-flaky.txt ]; then \
	  echo "test: failed once, passed when run again alone (flakes to fix):"; \
	  sed 's/^/test:   FLAKY /' $(BUILD)/test-flaky.txt; \
	fi; \
	if [ $$rc -ne 0 ]; then \
	  for t in $$failed; do \
	    echo "test: tier $$t failed; from $(BUILD)/test-$$t.tap:"; \
	    awk '/^not ok/ {p=1; print; next} /^(ok|# )/ {p=0} p' $(BUILD)/test-$$t.tap; \
	  done; \
	fi; exit $$rc
endef

# make check: the unit tier (under a minute), after every change.
check: check-format check-includes $(BUILD)/idemproc-unit
	$(call run_tiers,unit)

# make test: every tier, the README's test command.
test: check-format check-includes check-deploy $(BIN) $(TIER_BINS) $(PLUGINS) $(HOOKSINK) $(ORDERSINK) \
      $(TEST_PLUGINS)
	$(call run_tiers,$(TIERS))

# The lint of the deploy files (tests/check_deploy.sh): the kustomize
# overlays rendered and checked with jq, the Dockerfile, the PrometheusRule;
# it asks the binary only for its configuration keys. Then its self-test:
# one defect per check on a copy of deploy/ and config/, and that check
# alone must fail. kubectl is not a Debian package here; these machines
# ship it.
check-deploy: $(BIN) | deps-check-test
	@tests/check_deploy.sh $(BIN)
	@tests/check_deploy.sh --self-test $(BIN)

# Include directions between processor/'s folders (docs/design.md).
check-includes:
	@tests/check_includes.sh

demo: $(BIN) | deps-check-test
	@tests/demo.sh $(BIN)

demo-outbox: $(BIN) | deps-check-test
	@PG_BINDIR=$(PG_BINDIR) tests/demo_outbox.sh $(BIN)

$(HOOKSINK): tests/hooksink/hooksink.c tests/harness/hooksrv.c tests/harness/hooksrv.h | deps-check $(BUILD)/obj
	$(CC) -std=c11 -D_GNU_SOURCE $(WARN) $(CFLAGS) $(PKG_CFLAGS) -o $@ \
	  tests/hooksink/hooksink.c tests/harness/hooksrv.c $(LDFLAGS) $(LDLIBS_ALL)

$(ORDERSINK): tests/ordersink/ordersink.c | deps-check $(BUILD)/obj
	$(CC) -std=c11 -D_GNU_SOURCE $(WARN) $(CFLAGS) $(PKG_CFLAGS) -o $@ \
	  tests/ordersink/ordersink.c $(LDFLAGS) $(LDLIBS_ALL)

# The benchmark's own programs (tests/bench/, not part of the product):
# the classic per-message design (hiredis + librdkafka + jansson only) and
# the "Redis alone" driver, which sends the ledger chunks through
# idemproc's own store module (linked from its objects).
BENCH_CLASSIC    := $(BUILD)/bench/classic
BENCH_REDISALONE := $(BUILD)/bench/redisalone
# The member's mark table alone (ns per add and find, B/mark at 1M marks);
# run by hand: build/bench/marktab_bench [marks].
BENCH_MARKTAB    := $(BUILD)/bench/marktab_bench
# The member's partition lookup on the hot path (ns per record); by hand.
BENCH_PARTTABLES := $(BUILD)/bench/parttables_bench
# The assignment-time load of a partition of 1M marks (tests/bench_member.sh).
BENCH_PARTLOAD   := $(BUILD)/bench/partload_bench
# The chunk script's Redis CPU per record in one Redis's and a cluster
# primary's call shapes (tests/bench_cluster.sh).
BENCH_CHUNKCOST  := $(BUILD)/bench/chunkcost_bench

$(BENCH_CLASSIC): tests/bench/classic.c | deps-check
	@mkdir -p $(@D)
	$(CC) -std=c11 -D_GNU_SOURCE $(WARN) $(CFLAGS) -MMD -MP $(PKG_CFLAGS) \
	  -o $@ $< $(LDFLAGS) $(LDLIBS_ALL)

$(BENCH_REDISALONE): tests/bench/redisalone.c $(LIB_OBJS) | deps-check
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -Iprocessor -o $@ $< $(LIB_OBJS) $(LDFLAGS) $(LDLIBS_ALL)

$(BENCH_MARKTAB): tests/bench/marktab_bench.c $(LIB_OBJS) | deps-check
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -Iprocessor -o $@ $< $(LIB_OBJS) $(LDFLAGS) $(LDLIBS_ALL)

$(BENCH_PARTTABLES): tests/bench/parttables_bench.c $(LIB_OBJS) | deps-check
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -Iprocessor -o $@ $< $(LIB_OBJS) $(LDFLAGS) $(LDLIBS_ALL)

$(BENCH_PARTLOAD): tests/bench/partload_bench.c $(LIB_OBJS) | deps-check
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -Iprocessor -o $@ $< $(LIB_OBJS) $(LDFLAGS) $(LDLIBS_ALL)

$(BENCH_CHUNKCOST): tests/bench/chunkcost_bench.c $(LIB_OBJS) | deps-check
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -Iprocessor -o $@ $< $(LIB_OBJS) $(LDFLAGS) $(LDLIBS_ALL)

# Rows of `make bench`: kcat classic redis idemproc1 idemproc2 latency
# produce webhook outbox member cluster (all when none is named; member: the
# dedup state's member rows, tests/bench_member.sh, alone with
# BENCH_ONLY=member and its own BENCH_MEMBER_ROWS / BENCH_MEMBER_MODES;
# cluster: tests/bench_cluster.sh, alone with BENCH_ONLY=cluster); e.g.
# make bench BENCH_ROWS="kcat idemproc1". BENCH_REPS (3) repetitions.
BENCH_ROWS ?=
bench: $(BIN) $(HOOKSINK) $(ORDERSINK) $(BENCH_CLASSIC) $(BENCH_REDISALONE) $(BENCH_MARKTAB) $(BENCH_PARTTABLES) $(BENCH_PARTLOAD) $(BENCH_CHUNKCOST) | deps-check-bench
	@PG_BINDIR=$(PG_BINDIR) BENCH_ONLY=$(BENCH_ONLY) tests/bench.sh $(BIN) $(BENCH_ROWS)

# ThreadSanitizer: the HTTP thread against a thread updating the metrics as
# the loop does (tests/tsan/http_loop.c; Criterion does not run under TSan).
TSAN_BUILD ?= build-tsan

tsan:
	@$(MAKE) --no-print-directory BUILD=$(TSAN_BUILD) SAN=thread \
	  $(TSAN_BUILD)/tsan_http_loop
	TSAN_OPTIONS="halt_on_error=1 exitcode=66" $(TSAN_BUILD)/tsan_http_loop

$(BUILD)/tsan_%: tests/tsan/%.c $(LIB_OBJS)
	$(CC) $(ALL_CFLAGS) -Iprocessor -o $@ $< $(LIB_OBJS) $(LDFLAGS) $(LDLIBS_ALL)

memcheck: $(BIN) | deps-check-test
	@command -v valgrind >/dev/null || $(MAKE) --no-print-directory deps DEB_PKGS="$(CHECK_DEB_PKGS)"
	@tests/memcheck.sh $(BIN)

# CHAOS_CLUSTER=1 make chaos is make chaos-cluster.
chaos: $(BIN) | deps-check-test
	@if [ -n "$(CHAOS_CLUSTER)" ] && [ "$(CHAOS_CLUSTER)" != 0 ]; then \
	    tests/chaos_cluster.sh $(BIN); else tests/chaos.sh $(BIN); fi

chaos-cluster: $(BIN) | deps-check-test
	@tests/chaos_cluster.sh $(BIN)

# libFuzzer targets (tests/fuzz/fuzz_<target>.c), built with clang, ASan and
# UBSan in their own directory. Each runs FUZZ_SECONDS on a scratch corpus
# seeded from tests/fuzz/corpus/<target>/ (new inputs stay in the build
# dir); a crash stops make with the input under $(FUZZ_BUILD)/.
FUZZ_CC      ?= clang-14
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_ARGS    ?=
FUZZ_TARGETS := envelope conf_file conf_set redis_url dlq_headers
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=undefined
# (librdkafka's RD_KAFKA_V_* macros cast an int to a pointer: clang warns)
FUZZ_CFLAGS   = -std=c11 -D_GNU_SOURCE $(WARN) -Wno-int-to-void-pointer-cast \
                -g -O1 $(FUZZ_SAN) \
                -fsanitize=fuzzer-no-link -DIDEM_VERSION='"$(VERSION)"' \
                $(INCLUDES) $(PKG_CFLAGS)
FUZZ_OBJS    := $(LIB_OBJS:$(BUILD)/obj/%.o=$(FUZZ_BUILD)/obj/%.o)
FUZZ_BINS    := $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/fuzz_%)

$(FUZZ_BUILD)/obj:
	@mkdir -p $@

$(FUZZ_BUILD)/obj/%.o: processor/%.c | deps-check deps-check-fuzz $(FUZZ_BUILD)/obj
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -MMD -MP -c -o $@ $<

$(FUZZ_BUILD)/obj/%_lua.o: $(BUILD)/gen/%_lua.c | deps-check deps-check-fuzz $(FUZZ_BUILD)/obj
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -MMD -MP -c -o $@ $<

$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_OBJS)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -Iprocessor -o $@ $^ $(LDLIBS_ALL)

fuzz-build: $(FUZZ_BINS)

fuzz: fuzz-build
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_BUILD)/corpus/$$t $(FUZZ_BUILD)/crashes/$$t; \
	  echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
	  $(FUZZ_BUILD)/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	    -artifact_prefix=$(FUZZ_BUILD)/crashes/$$t/ $(FUZZ_ARGS) \
	    $(FUZZ_BUILD)/corpus/$$t tests/fuzz/corpus/$$t \
	    > $(FUZZ_BUILD)/$$t.log 2>&1 \
	    || { tail -40 $(FUZZ_BUILD)/$$t.log; echo "fuzz: $$t failed"; exit 1; }; \
	  grep -E '^stat::number_of_executed_units|^Done' $(FUZZ_BUILD)/$$t.log; \
	done

install: $(BIN)
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/idemproc
	install -D -m 0644 processor/include/idemproc/plugin.h \
	  $(DESTDIR)$(PREFIX)/include/idemproc/plugin.h

clean:
	rm -rf $(BUILD) $(FUZZ_BUILD) $(TSAN_BUILD)

-include $(OBJS:.o=.d) $(TEST_OBJS:.o=.d) $(FUZZ_OBJS:.o=.d) \
         $(PLUGINS:.so=.d) $(TEST_PLUGINS:.so=.d) \
         $(BENCH_CLASSIC).d $(BENCH_REDISALONE).d $(BENCH_MARKTAB).d $(BENCH_PARTTABLES).d $(BENCH_PARTLOAD).d
