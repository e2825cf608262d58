// The `deepharness` binary: dispatches to the subcommands registered by apps/cmd_*.cc. Backends
// register themselves (backend/registry.h).
#include <algorithm>
#include <cstdio>

#include "apps/command.h"

namespace dh::app {
std::vector<CommandSpec>& CommandRegistry() {
  static std::vector<CommandSpec> registry;
  return registry;
}
}  // namespace dh::app

int main(int argc, char** argv) {
  using namespace dh::app;
  CLI::App app{"deepharness: DeepSeek-family models on any hardware, OpenAI-compatible serving",
               "deepharness"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "deepharness 0.1.0");
  auto& registry = CommandRegistry();
  std::sort(registry.begin(), registry.end(),
            [](const CommandSpec& a, const CommandSpec& b) { return a.name < b.name; });
  std::function<int()> action;
  for (auto& spec : registry) {
    CLI::App* sub = app.add_subcommand(spec.name, spec.description);
    auto run = spec.setup(sub);
    sub->callback([&action, run] { action = run; });
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "error: %s\n", e.what());
    return kExitBadInput;
  }
  return action ? action() : kExitBadInput;
}
