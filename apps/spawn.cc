#include "apps/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "apps/command.h"

namespace dh::app {

Result<pid_t> SpawnProcess(const std::vector<std::string>& args, int output_fd,
                           std::string_view hint) {
  if (args.empty()) return Internal("no program to start");
  // Built before fork: the child only calls async-signal-safe functions until exec.
  std::vector<std::string> own = args;
  std::vector<char*> argv;
  for (std::string& a : own) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string failure =
      hint.empty() ? "error: cannot run " + args[0] + ": "
                   : "error: cannot run " + args[0] + " (" + std::string(hint) + "): ";
  const pid_t pid = ::fork();
  if (pid < 0) return Internal("fork failed while starting {}", args[0]);
  if (pid > 0) return pid;
  if (output_fd >= 0) {
    ::dup2(output_fd, STDOUT_FILENO);
    ::dup2(output_fd, STDERR_FILENO);
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
  }
  sigset_t none;
  sigemptyset(&none);
  ::pthread_sigmask(SIG_SETMASK, &none, nullptr);
  ::signal(SIGPIPE, SIG_DFL);
  ::execvp(argv[0], argv.data());
  const char* reason = std::strerror(errno);
  (void)!::write(STDERR_FILENO, failure.data(), failure.size());
  (void)!::write(STDERR_FILENO, reason, std::strlen(reason));
  (void)!::write(STDERR_FILENO, "\n", 1);
  std::_Exit(kExitBadInput);
}

}  // namespace dh::app
