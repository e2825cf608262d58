// `deepharness bench` hosts several benchmarks: each registers here with
// DH_REGISTER_BENCH_COMMAND and becomes `deepharness bench <name>` (e.g. `bench serve`). An entry
// with an empty name adds its options to `bench` itself and runs when no benchmark name is given
// (the offline llama-bench-style benchmark of issue 7 can live there), so no two files ever
// register the top-level `bench` command.
#pragma once

#include <vector>

#include "apps/command.h"

namespace dh::app {

std::vector<CommandSpec>& BenchCommandRegistry();

}  // namespace dh::app

#define DH_REGISTER_BENCH_COMMAND(var, name, description, setup) \
  static ::dh::app::BenchRegistrar var({name, description, setup})

namespace dh::app {
struct BenchRegistrar {
  explicit BenchRegistrar(CommandSpec spec) { BenchCommandRegistry().push_back(std::move(spec)); }
};
}  // namespace dh::app
