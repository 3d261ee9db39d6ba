# outbox_dispatcher — PGXS build.
#
# C++17 sources in src/ are compiled into outbox_dispatcher.so.  Files under
# src/core/ are pure C++ (no PostgreSQL headers); they are also linked into
# the GoogleTest binary built by `make unit`.

EXTENSION   = outbox_dispatcher
MODULE_big  = outbox_dispatcher
DATA        = sql/outbox_dispatcher--0.1.0.sql sql/outbox_dispatcher--0.1.0--0.2.0.sql \
              sql/outbox_dispatcher--0.2.0--0.2.1.sql sql/outbox_dispatcher--0.2.1--0.2.2.sql \
              sql/outbox_dispatcher--0.2.2--0.3.0.sql sql/outbox_dispatcher--0.3.0.sql
PGFILEDESC  = "outbox_dispatcher - transactional outbox delivery from background workers"

CORE_SRCS   = $(sort $(wildcard src/core/*.cpp))
PG_SRCS     = $(sort $(wildcard src/*.cpp))
OBJS        = $(PG_SRCS:.cpp=.o) $(CORE_SRCS:.cpp=.o)

PG_CPPFLAGS = -Isrc
PG_CXXFLAGS = -std=c++17 -Wno-register -Wno-missing-field-initializers
SHLIB_LINK  = -lstdc++ -lcurl -lcrypto

# pg_regress suites: test/regress/sql/<name>.sql inputs, test/regress/expected/<name>.out
# (sql/ holds only the extension's scripts).
REGRESS      = schema enqueue claim finalize ordering operator operations validation privileges views security fanout rotation tracecontext retry_policy egress oauth
REGRESS_OPTS = --inputdir=test/regress

PG_CONFIG ?= pg_config

# Debian's PGXS is built with LLVM JIT support and would emit bitcode for
# every object with clang; we do not ship bitcode for a C++ extension.
override with_llvm = no

PGXS := $(shell $(PG_CONFIG) --pgxs)
# Read by PGXS's clean rule when it is included, so it must be set before.
EXTRA_CLEAN = test/unit/unit_tests results regression.diffs regression.out output_iso tmp_check

include $(PGXS)

# PGXS tracks no header dependencies: rebuild every object when any header
# changes (a struct laid out differently in two objects is a crash).
HEADERS     = $(wildcard src/*.h src/core/*.hpp)
$(OBJS): $(HEADERS)

# ---------------------------------------------------------------- unit tests
GTEST_BIN = test/unit/unit_tests
UNIT_SRCS = $(sort $(wildcard test/unit/*.cpp))

$(GTEST_BIN): $(UNIT_SRCS) $(CORE_SRCS) $(wildcard src/core/*.hpp)
	$(CXX) -std=c++17 -O1 -g -Wall -Isrc -o $@ $(UNIT_SRCS) $(CORE_SRCS) -lgtest -lgtest_main -lpthread -lcurl -lcrypto

unit: $(GTEST_BIN)
	./$(GTEST_BIN)

.PHONY: unit

# The same GoogleTest binary built with AddressSanitizer (+ LeakSanitizer,
# on by default on Linux x86_64) and UndefinedBehaviorSanitizer; any report
# fails the run.  Not part of test-all.
GTEST_ASAN_BIN = test/unit/unit_tests_asan
ASAN_FLAGS     = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all

$(GTEST_ASAN_BIN): $(UNIT_SRCS) $(CORE_SRCS) $(wildcard src/core/*.hpp)
	$(CXX) -std=c++17 -O1 -g -Wall $(ASAN_FLAGS) -Isrc -o $@ $(UNIT_SRCS) $(CORE_SRCS) -lgtest -lgtest_main -lpthread -lcurl -lcrypto

unit-asan: $(GTEST_ASAN_BIN)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	./$(GTEST_ASAN_BIN)

# (a clean hook of its own: EXTRA_CLEAN is read by PGXS's clean rule at
# include time, so a value set after the include is not seen)
clean: clean-unit-asan
clean-unit-asan:
	rm -f $(GTEST_ASAN_BIN)

.PHONY: unit-asan clean-unit-asan

print-regress:
	@echo $(REGRESS)

# Every test layer (unit, regress, isolation, TAP) on every supported
# PostgreSQL major (PG_MAJOR=15|17|18 for one); see test/test_all_versions.sh.
test-all:
	./test/test_all_versions.sh

# Every performance scenario, 3 runs each; results in bench-results/
# (test/bench/run_bench.sh).  bench-readme puts the last results into the
# README's performance section.
bench:
	./test/bench/run_bench.sh

bench-readme:
	/usr/bin/python3 test/bench/readme_section.py bench-results/results.md README.md

# Format the C++ with clang-format (.clang-format: src/ in PostgreSQL's layout;
# src/core/ and test/unit/ have their own).
format:
	clang-format -i src/*.cpp src/*.h src/core/*.cpp src/core/*.hpp test/unit/*.cpp

.PHONY: print-regress test-all bench bench-readme format

# The main job: a throwaway cluster, a local endpoint, messages flowing,
# a live summary.  See test/demo.sh.
demo:
	./test/demo.sh

.PHONY: demo
