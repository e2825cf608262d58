// Starting a child process (fork + exec) the way the commands that launch others need it:
// `compare`'s local targets (child_server.h) and `serve --tp-size N` starting mpirun
// (serve_parallel.h).
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dh::app {

// Runs args[0] (looked up in PATH when it has no '/') with `args` in a new process and returns
// its pid. The child starts with an empty signal mask and SIGPIPE at its default, so a parent that
// blocks signals for a signal thread or ignores SIGPIPE does not pass that on. output_fd >= 0:
// the child's stdout and stderr go to it and its stdin reads /dev/null. If the program cannot be
// run, the child prints "error: cannot run <args[0]>[ (<hint>)]: <reason>" and exits 2.
Result<pid_t> SpawnProcess(const std::vector<std::string>& args, int output_fd = -1,
                           std::string_view hint = {});

}  // namespace dh::app
