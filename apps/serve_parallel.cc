// Rank roles of `serve --tp-size N` (serve_parallel.h).
#include "apps/serve_parallel.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "apps/command.h"
#include "apps/parallel.h"
#include "apps/spawn.h"
#include "base/log.h"
#include "model/step_broadcast.h"
#ifdef DH_HAVE_MPI
#include "comm/mpi/mpi_communicator.h"
#endif

namespace dh::app {
namespace {

// This process's own arguments, from /proc/self/cmdline.
std::vector<std::string> OwnArguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  size_t start = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i] == '\0') {
      args.push_back(all.substr(start, i - start));
      start = i + 1;
    }
  }
  return args;
}

// The pid of rank 0 among mpirun's children (its environment says OMPI_COMM_WORLD_RANK=0), or
// `mpirun` itself when it is not found.
pid_t RankZeroOf(pid_t mpirun) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(line.c_str() + close + 1, " %c %d", &state, &ppid) != 2 || ppid != mpirun) {
      continue;
    }
    std::ifstream env(e.path() / "environ", std::ios::binary);
    std::string var;
    while (std::getline(env, var, '\0')) {
      if (var == "OMPI_COMM_WORLD_RANK=0") return static_cast<pid_t>(std::stoi(name));
    }
  }
  return mpirun;
}

// How long mpirun may outlive rank 0 before the launcher ends the job.
constexpr std::chrono::seconds kRankZeroGrace{5};

// Where rank 0 leaves its exit status for the launcher (ReportLeaderExit).
constexpr const char* kExitFileVariable = "DEEPHARNESS_TP_EXIT_FILE";

// The status rank 0 left in `path`, or nullopt when it left none (it ended through _Exit or a
// signal).
std::optional<int> LeaderExitStatus(const std::string& path) {
  std::ifstream in(path);
  int code = 0;
  if (in >> code) return code;
  return std::nullopt;
}

// Runs `mpirun -np N /proc/self/exe ARGS...` and exits with its status.
Status LaunchUnderMpirun(int ranks) {
  // A rank that dies must not make mpirun kill rank 0 at once (orte_abort_on_non_zero_status):
  // rank 0 notices it, answers the requests in flight with 503 and exits, and its exit without
  // finalizing MPI ends the job (docs/parallel.md).
  std::vector<std::string> args = {"mpirun", "-np", std::to_string(ranks), "--oversubscribe",
                                   "--mca", "orte_abort_on_non_zero_status", "0"};
  if (::geteuid() == 0) args.push_back("--allow-run-as-root");
  std::vector<std::string> own = OwnArguments();
  if (own.empty()) return Internal("cannot read /proc/self/cmdline to start the ranks");
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return Internal("cannot read /proc/self/exe to start the ranks");
  own[0] = std::string(exe, static_cast<size_t>(n));
  args.insert(args.end(), own.begin(), own.end());
  // mpirun exits 0 whatever the ranks return (orte_abort_on_non_zero_status 0): rank 0 writes
  // its status to this file (inherited through mpirun's environment) for this process to exit with.
  std::string exit_file = (std::filesystem::temp_directory_path() / "deepharness-tp-XXXXXX").string();
  const int exit_fd = ::mkstemp(exit_file.data());
  if (exit_fd < 0) return Internal("cannot create {} for rank 0's exit status", exit_file);
  ::close(exit_fd);
  ::setenv(kExitFileVariable, exit_file.c_str(), 1);
  DH_LOG(Info, "--tp-size {}: starting the ranks with mpirun -np {}", ranks, ranks);
  DH_ASSIGN_OR_RETURN(const pid_t pid, SpawnProcess(args, -1, "install openmpi-bin"));
  // SIGTERM / SIGINT sent to this process go to rank 0, which drains, stops the other ranks and
  // exits 0 (mpirun itself would end the job at once, with a failure status).
  std::thread([pid] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    while (true) {
      int sig = 0;
      if (::sigwait(&set, &sig) == 0) ::kill(RankZeroOf(pid), sig);
    }
  }).detach();
  // mpirun runs with orte_abort_on_non_zero_status 0, so it does not end the job when rank 0
  // exits after a rank failure: once rank 0 has been gone a few seconds while mpirun still
  // waits (on a hung rank), SIGTERM to mpirun ends the rest of the job, on every host.
  int status = 0;
  pid_t rank0 = 0;
  std::optional<std::chrono::steady_clock::time_point> rank0_gone;
  bool ended_job = false;
  while (true) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid || (done < 0 && errno != EINTR)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (rank0 == 0 || rank0 == pid) {
      rank0 = RankZeroOf(pid);
    } else if (!rank0_gone && ::kill(rank0, 0) != 0) {
      rank0_gone = std::chrono::steady_clock::now();
    } else if (rank0_gone && !ended_job &&
               std::chrono::steady_clock::now() - *rank0_gone > kRankZeroGrace) {
      ::kill(pid, SIGTERM);
      ended_job = true;
    }
  }
  const std::optional<int> leader = LeaderExitStatus(exit_file);
  ::unlink(exit_file.c_str());
  const int mpirun_status = WIFEXITED(status) ? WEXITSTATUS(status) : kExitFailure;
  // Without a status rank 0 ended through a rank failure (or was killed): 1. A follower that
  // had to be ended after rank 0's clean exit does not change rank 0's 0.
  int code = kExitFailure;
  if (leader) code = *leader != kExitOk ? *leader : (ended_job ? kExitOk : mpirun_status);
  std::exit(code);
}

}  // namespace

Result<ServeRole> StartServeRanks(const ModelOptions& model, std::vector<RankIdentity>* ranks,
                                  std::shared_ptr<comm::Communicator>* comm) {
#ifdef DH_HAVE_MPI
  if (!comm::LaunchedByMpi()) {
    DH_RETURN_IF_ERROR(LaunchUnderMpirun(model.tp_size));
    return ServeRole::kLauncherDone;
  }
  DH_ASSIGN_OR_RETURN(ParallelRun run, StartParallel(model.tp_size, model.ep_size, model.threads));
  DH_ASSIGN_OR_RETURN(std::vector<RankIdentity> ids, ExchangeRankIdentities(*run.comm, 0));
  if (ranks != nullptr) *ranks = std::move(ids);
  if (comm != nullptr) *comm = run.comm;
  return run.options.rank == 0 ? ServeRole::kLeader : ServeRole::kFollower;
#else
  return Unsupported("--tp-size {}: this build has no MPI (install libopenmpi-dev and rebuild)",
                     model.tp_size);
#endif
}

int FollowLeader(const ModelOptions& model, SelfCheckMode self_check) {
  CheckingBackend* checker = nullptr;
  BackendWrapper wrap;
  if (self_check != SelfCheckMode::kOff) {
    wrap = [&checker](std::unique_ptr<Backend> inner) -> std::unique_ptr<Backend> {
      auto c = std::make_unique<CheckingBackend>(std::move(inner));
      checker = c.get();
      return c;
    };
  }
  auto loaded = LoadFromOptions(model, wrap);
  if (!loaded.ok()) return ReportError(loaded.status());
  // Every rank has loaded (rank 0's start-up watch bounds each collective from here on).
  if (Status st = loaded->parallel.comm->Barrier(); !st.ok()) return ReportError(st);
  if (checker != nullptr) {
    // In step with rank 0's check (cmd_serve.cc), which reports the outcome for every rank.
    const SelfCheckReport r =
        RunSelfCheckOnRanks(*loaded->model, *checker, self_check,
                            loaded->model->info().weight_bytes, *loaded->parallel.comm);
    if (r.out_of_step) {
      std::fprintf(stderr, "error: %s\n", r.message.c_str());
      std::fflush(stderr);
      std::_Exit(kExitFailure);
    }
    if (r.state == "failed") return kExitBadInput;
    checker->ReleaseHeldRows();  // the reference has read the stored layout for the last time
  }
  Status st = FollowSteps(*loaded->model, *loaded->backend, *loaded->parallel.comm);
  return st.ok() ? kExitOk : ReportError(st);
}

std::optional<int> LeadOrFollow(LoadedModel& loaded, std::chrono::seconds step_timeout) {
  comm::Communicator* comm = loaded.parallel.comm.get();
  if (comm == nullptr) return std::nullopt;
  if (IsLeadRank(loaded)) {
    loaded.model = MakeStepLeader(std::move(loaded.model), *comm, step_timeout);
    return std::nullopt;
  }
  Status st = FollowSteps(*loaded.model, *loaded.backend, *comm);
  return st.ok() ? kExitOk : ReportError(st);
}

StartupWatch::StartupWatch(std::shared_ptr<ParallelJob> job, const comm::Communicator& comm,
                           std::chrono::seconds bound)
    : job_(std::move(job)), comm_(comm), bound_(bound), thread_([this] { Run(); }) {}

StartupWatch::~StartupWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StartupWatch::SetPhase(std::string phase) {
  std::lock_guard<std::mutex> lock(mu_);
  phase_ = std::move(phase);
}

void StartupWatch::Bound() {
  std::lock_guard<std::mutex> lock(mu_);
  bounded_ = true;
}

void StartupWatch::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(100));
    if (stop_) return;
    std::string why;
    if (job_->LocalRankExited()) {
      why = "a rank exited";
    } else if (bounded_ && TimeInCollective(comm_) > bound_) {
      why = fmt::format("a collective did not finish within {} s", bound_.count());
    } else {
      continue;
    }
    std::fprintf(stderr, "error: tensor-parallel start-up (%s): %s; %s\n", phase_.c_str(),
                 why.c_str(), job_->DescribeRanks().c_str());
    std::fflush(stderr);
    std::_Exit(kExitFailure);
  }
}

void ReportLeaderExit(int code) {
  const char* path = std::getenv(kExitFileVariable);
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (path == nullptr || rank == nullptr || std::string(rank) != "0") return;
  std::ofstream out(path, std::ios::trunc);
  out << code << "\n";
}

}  // namespace dh::app
