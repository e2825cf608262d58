// Subcommand registry for the `deepharness` binary. Each apps/cmd_*.cc file registers its
// subcommands with DH_REGISTER_COMMAND, so adding a command touches no shared file.
// Exit codes: 0 success, 1 runtime failure, 2 bad input (flags, files, ids) — one line on stderr.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace dh::app {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;

// Setup adds the subcommand's options to `sub` and returns the action to run when it is chosen.
using CommandSetup = std::function<std::function<int()>(CLI::App* sub)>;

struct CommandSpec {
  std::string name;
  std::string description;
  CommandSetup setup;
};

std::vector<CommandSpec>& CommandRegistry();

struct CommandRegistrar {
  explicit CommandRegistrar(CommandSpec spec) { CommandRegistry().push_back(std::move(spec)); }
};

}  // namespace dh::app

#define DH_REGISTER_COMMAND(var, name, description, setup) \
  static ::dh::app::CommandRegistrar var({name, description, setup})
