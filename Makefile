# The two commands of the README's Quickstart, plus helpers.
BUILD ?= build
JOBS ?= $(shell nproc)
# The sanitizer and fuzz builds go through ccache when it is installed (they are long builds).
LAUNCHER := $(if $(shell command -v ccache),-DCMAKE_CXX_COMPILER_LAUNCHER=ccache,)

.PHONY: setup build run test clean format sanitize tsan fuzz

setup:
	./scripts/setup.sh

build: setup
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD) -j $(JOBS)

run: build
	./scripts/run_demo.sh $(BUILD)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900

# ASan + UBSan build in its own directory, then the whole suite under it (docs/reliability.md).
# SANITIZE_TESTS='-R regex' narrows the run. The multi-process tests run with leak detection off:
# Open MPI 4.1 keeps allocations of its own (and of the plugins it unloads) past MPI_Finalize;
# address and undefined-behaviour checks stay on there.
SAN_FLAGS = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
SAN_MPI_TESTS = ^(comm_mpi_np|tp_mpi_np|serve_tp_np|dump_tp_np|tp_two_hosts|CompareCliTest.LocalTensorParallel|OpenAiSdkTest.*TensorParallelism)
SAN_ENV = UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:log_path=$(CURDIR)/build-asan/san-logs/ubsan
SAN_ASAN = abort_on_error=1:log_path=$(CURDIR)/build-asan/san-logs/asan
sanitize: setup
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Release $(LAUNCHER) \
	  -DCMAKE_CXX_FLAGS="$(SAN_FLAGS)" -DCMAKE_EXE_LINKER_FLAGS="$(SAN_FLAGS)"
	cmake --build build-asan -j $(JOBS)
	rm -rf build-asan/san-logs && mkdir -p build-asan/san-logs
	# Every report (the tests' and those of the servers the end-to-end tests start) goes to
	# build-asan/san-logs/; any file there fails the target.
	cd build-asan && $(SAN_ENV) ASAN_OPTIONS=detect_leaks=1:$(SAN_ASAN) \
	  ctest --output-on-failure -j $(JOBS) --timeout 1800 -E '$(SAN_MPI_TESTS)' $(SANITIZE_TESTS); \
	  status=$$?; \
	  if [ -z "$(SANITIZE_TESTS)" ]; then $(SAN_ENV) ASAN_OPTIONS=detect_leaks=0:$(SAN_ASAN) \
	    ctest --output-on-failure -j $(JOBS) --timeout 1800 -R '$(SAN_MPI_TESTS)' || status=1; fi; \
	  if ls san-logs/* >/dev/null 2>&1; then cat san-logs/*; status=1; fi; exit $$status

# ThreadSanitizer build of the engine, server and thread-pool tests (and the binary the
# end-to-end server tests start).
TSAN_FLAGS = -fsanitize=thread -fno-omit-frame-pointer
tsan: setup
	cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Release $(LAUNCHER) \
	  -DCMAKE_CXX_FLAGS="$(TSAN_FLAGS)" -DCMAKE_EXE_LINKER_FLAGS="$(TSAN_FLAGS)"
	cmake --build build-tsan -j $(JOBS) --target deepharness unit_base_tests unit_engine_tests \
	  unit_server_tests e2e_tests
	rm -rf build-tsan/san-logs && mkdir -p build-tsan/san-logs
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$(CURDIR)/tests/tsan.supp:log_path=$(CURDIR)/build-tsan/san-logs/tsan \
	  ctest --output-on-failure -j $(JOBS) --timeout 1800 \
	  -R '^(ThreadPoolTest|EngineTest|SchedulerTest|SamplerTest|Http[A-Za-z]*Test|Reliability[A-Za-z]*|LoadTest|ChatValidation|CompletionValidation|Sse|Responses|Metrics)\.'; \
	  status=$$?; if ls san-logs/* >/dev/null 2>&1; then cat san-logs/*; status=1; fi; exit $$status

# libFuzzer targets (clang-14, ASan + UBSan) in build-fuzz/: fuzz_<target> per tests/fuzz/*_fuzz.cc.
# Only the parsing layers are compiled (DH_FUZZ_ONLY). Run them with scripts/fuzz.sh
# (docs/reliability.md "Fuzzing"); the normal build replays the corpora in ctest (fuzz_replay_*).
FUZZ_FLAGS = -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer \
  -fno-sanitize-recover=undefined
fuzz: setup
	cmake -S . -B build-fuzz -G Ninja -DDH_FUZZ_ONLY=ON -DCMAKE_BUILD_TYPE=Fuzz \
	  -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_CXX_FLAGS_FUZZ="-O1 -g" $(LAUNCHER) \
	  -DCMAKE_CXX_FLAGS="$(FUZZ_FLAGS)"
	cmake --build build-fuzz -j $(JOBS) --target fuzz_all

format:
	find src apps tests bench -name '*.cc' -o -name '*.h' | xargs clang-format -i

clean:
	rm -rf $(BUILD)
