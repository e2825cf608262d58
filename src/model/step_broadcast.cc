// Leader/follower step broadcast and rank-failure handling (step_broadcast.h).
#include "model/step_broadcast.h"

#include <unistd.h>

#include <array>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "base/log.h"
#include "model/kv_storage.h"

namespace dh {
namespace {

template <typename... Args>
Status Cancelled(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kCancelled, fmt::format(f, std::forward<Args>(args)...));
}

// The header every step starts with; kind 0 stops the followers. kReport 1: after the forward,
// every rank's resident memory is gathered on rank 0.
enum Field { kKind, kTokens, kSeqs, kMaxBlocks, kRows, kNumBlocks, kBlockSize, kReport, kNumFields };
using Header = std::array<int64_t, kNumFields>;

// How often the leader gathers the ranks' resident memory.
constexpr std::chrono::seconds kMemoryReportInterval{1};

// The int32 arrays of a batch, in broadcast order, and their lengths from the header.
std::array<std::vector<int32_t>*, 7> Arrays(Batch& b) {
  return {&b.token_ids, &b.positions,    &b.query_start, &b.seq_lens,
          &b.block_tables, &b.slot_mapping, &b.logits_rows};
}
std::array<int64_t, 7> Lengths(const Header& h) {
  return {h[kTokens], h[kTokens], h[kSeqs] + 1, h[kSeqs], h[kSeqs] * h[kMaxBlocks], h[kTokens],
          h[kRows]};
}

Status SendOrReceive(comm::Communicator& comm, Header& h, Batch& b) {
  DH_RETURN_IF_ERROR(comm.Broadcast(h.data(), sizeof(Header), 0));
  if (h[kKind] == 0) return Status::Ok();
  b.max_blocks_per_seq = static_cast<int>(h[kMaxBlocks]);
  std::vector<int32_t> flat;
  const auto arrays = Arrays(b);
  const auto lengths = Lengths(h);
  int64_t total = 0;
  for (int64_t n : lengths) total += n;
  if (comm.Rank() == 0) {
    for (auto* a : arrays) flat.insert(flat.end(), a->begin(), a->end());
  } else {
    flat.resize(static_cast<size_t>(total));
  }
  DH_RETURN_IF_ERROR(comm.Broadcast(flat.data(), flat.size() * sizeof(int32_t), 0));
  if (comm.Rank() != 0) {
    size_t at = 0;
    for (size_t i = 0; i < arrays.size(); ++i) {
      arrays[i]->assign(flat.begin() + at, flat.begin() + at + lengths[i]);
      at += static_cast<size_t>(lengths[i]);
    }
  }
  return Status::Ok();
}

// This process's resident set size (/proc/self/statm), 0 when unreadable.
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  if (!(statm >> pages >> resident)) return 0;
  return resident * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

// Every rank's resident memory, in rank order (collective).
Result<std::vector<int64_t>> GatherMemory(comm::Communicator& comm) {
  const int64_t mine = ResidentBytes();
  std::vector<int64_t> all(static_cast<size_t>(comm.Size()));
  DH_RETURN_IF_ERROR(comm.AllGather(&mine, sizeof(mine), all.data()));
  return all;
}

// The leader's model. Forward hands the step to the stepper thread (which makes every MPI call,
// so they stay serialized) and waits for it with a deadline.
class StepLeader final : public Model {
 public:
  StepLeader(std::unique_ptr<Model> inner, comm::Communicator& comm, std::chrono::seconds timeout,
             std::shared_ptr<ParallelJob> job)
      : inner_(std::move(inner)), comm_(comm), timeout_(timeout), job_(std::move(job)) {
    stepper_ = std::thread([this] { RunSteps(); });
    backstop_ = std::thread([this] { Backstop(); });
  }
  ~StepLeader() override {
    if (job_->failure()) {
      // The stepper may be inside a collective that never returns, and MPI cannot be finalized
      // with a rank gone: end the process here rather than hang in the communicator's teardown.
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(1);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      has_job_ = true;  // the stop header
    }
    cv_.notify_all();
    stepper_.join();
    backstop_.join();
    const comm::CommStats& cs = comm_.Stats();
    DH_LOG(Info, "tensor parallelism: {} steps; rank 0 spent {:.3f} s in {} collectives ({:.1f} MiB)",
           step_, cs.seconds, cs.calls, cs.bytes / 1048576.0);
  }

  const ModelConfig& config() const override { return inner_->config(); }
  KvCacheSpec kv_spec() const override { return inner_->kv_spec(); }
  const ModelInfo& info() const override { return inner_->info(); }

  Status Forward(const Batch& batch, KvStorage& kv, std::vector<float>* logits) override {
    if (auto f = job_->failure()) return *f;
    std::unique_lock<std::mutex> lock(mu_);
    // The stepper works on its own copies: after a failure it may still be inside the step while
    // the engine moves on.
    job_batch_ = batch;
    job_batch_.logits_on_rank0_only = true;
    job_kv_ = &kv;
    has_job_ = true;
    job_done_ = false;
    const uint64_t step = ++step_;
    cv_.notify_all();
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (!job_done_) {
      // Short waits: a failure recorded elsewhere (mpirun ending the job) ends this one too.
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      if (job_done_) break;
      if (auto f = job_->failure()) return *f;
      if (job_->LocalRankExited()) {
        lock.unlock();
        return Fail(Cancelled("tensor-parallel step {}: a rank exited; {}", step,
                              job_->DescribeRanks()));
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        lock.unlock();
        return Fail(Cancelled("tensor-parallel step {} did not finish within {} s; {}", step,
                              timeout_.count(), job_->DescribeRanks()));
      }
    }
    if (!job_status_.ok()) {
      lock.unlock();
      return Fail(Cancelled("tensor-parallel step {} failed: {}; {}", step, job_status_.message(),
                            job_->DescribeRanks()));
    }
    logits->swap(job_logits_);
    return Status::Ok();
  }

 private:
  Status Fail(Status reason) {
    job_->Fail(std::move(reason));
    return *job_->failure();
  }

  void RunSteps() {
    std::unique_lock<std::mutex> lock(mu_);
    auto last_report = std::chrono::steady_clock::time_point{};
    while (true) {
      cv_.wait(lock, [this] { return has_job_; });
      has_job_ = false;
      if (stopping_) {
        lock.unlock();
        Header h{};
        Batch none;
        Status st = SendOrReceive(comm_, h, none);
        if (!st.ok()) DH_LOG(Warning, "stopping the follower ranks: {}", st.message());
        return;
      }
      Batch& batch = job_batch_;
      KvStorage& kv = *job_kv_;
      lock.unlock();
      const auto now = std::chrono::steady_clock::now();
      const bool report = now - last_report >= kMemoryReportInterval;
      if (report) last_report = now;
      Header h{1,
               batch.num_tokens(),
               batch.num_seqs(),
               batch.max_blocks_per_seq,
               static_cast<int64_t>(batch.logits_rows.size()),
               kv.num_blocks(),
               kv.block_size(),
               report ? 1 : 0};
      const comm::CommStats before = comm_.Stats();
      std::vector<float> logits;
      Status st = SendOrReceive(comm_, h, batch);
      if (st.ok()) st = inner_->Forward(batch, kv, &logits);
      if (st.ok() && report) {
        auto memory = GatherMemory(comm_);
        if (memory.ok()) job_->SetRankMemory(std::move(memory).value());
        st = memory.status();
      }
      if (st.ok()) {
        const comm::CommStats& after = comm_.Stats();
        job_->ObserveStep({after.seconds - before.seconds, after.bytes - before.bytes,
                           after.calls - before.calls});
      }
      lock.lock();
      job_status_ = std::move(st);
      job_logits_.swap(logits);
      job_done_ = true;
      cv_.notify_all();
    }
  }

  // Ends the process if it is still running kRankFailureGrace after a failure.
  void Backstop() {
    std::unique_lock<std::mutex> lock(mu_);
    std::optional<std::chrono::steady_clock::time_point> failed_at;
    while (!stopping_) {
      cv_.wait_for(lock, std::chrono::seconds(1));
      if (!failed_at && job_->failure()) failed_at = std::chrono::steady_clock::now();
      if (failed_at && std::chrono::steady_clock::now() - *failed_at > kRankFailureGrace) {
        std::fprintf(stderr, "error: %s\n", job_->failure()->message().c_str());
        std::fflush(stderr);
        std::_Exit(1);
      }
    }
  }

  std::unique_ptr<Model> inner_;
  comm::Communicator& comm_;
  std::chrono::seconds timeout_;
  std::shared_ptr<ParallelJob> job_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false, has_job_ = false, job_done_ = false;
  Batch job_batch_;
  KvStorage* job_kv_ = nullptr;
  Status job_status_;
  std::vector<float> job_logits_;
  uint64_t step_ = 0;
  std::thread stepper_, backstop_;
};

// /proc/PID/stat's state letter, or 0 when the process is gone.
char ProcessState(int64_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return 0;
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() ? line[close + 2] : 0;
}

}  // namespace

ParallelJob::ParallelJob(std::function<void(const Status&)> on_failure)
    : on_failure_(std::move(on_failure)) {}

bool ParallelJob::Fail(Status reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (reason_) return false;
    reason_ = reason;
  }
  if (on_failure_) on_failure_(reason);
  return true;
}

std::optional<Status> ParallelJob::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

void ParallelJob::SetRanks(std::vector<RankIdentity> ranks) {
  std::lock_guard<std::mutex> lock(mu_);
  ranks_ = std::move(ranks);
}

std::vector<RankIdentity> ParallelJob::ranks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ranks_;
}

void ParallelJob::SetRankMemory(std::vector<int64_t> bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  rank_memory_ = std::move(bytes);
}

std::vector<int64_t> ParallelJob::rank_memory() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rank_memory_;
}

void ParallelJob::SetStepObserver(std::function<void(const StepComm&)> observer) {
  std::lock_guard<std::mutex> lock(mu_);
  observer_ = std::move(observer);
}

void ParallelJob::ObserveStep(const StepComm& step) const {
  std::function<void(const StepComm&)> observer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    observer = observer_;
  }
  if (observer) observer(step);
}

bool ParallelJob::LocalRankExited() const {
  const std::vector<RankIdentity> all = ranks();
  char host[64] = {};
  ::gethostname(host, sizeof(host) - 1);
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r].host != host) continue;
    const char state = ProcessState(all[r].pid);
    if (state == 0 || state == 'Z' || state == 'X') return true;
  }
  return false;
}

std::string ParallelJob::DescribeRanks() const {
  const std::vector<RankIdentity> all = ranks();
  char host[64] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string out;
  for (size_t r = 1; r < all.size(); ++r) {
    const RankIdentity& id = all[r];
    std::string what;
    if (id.host != host) {
      what = fmt::format("rank {} (pid {} on {}): on another host", r, id.pid, id.host);
    } else {
      const char state = ProcessState(id.pid);
      const char* says = state == 0 || state == 'Z' || state == 'X' ? "has exited"
                         : state == 'T' || state == 't'             ? "is stopped"
                                                                    : "is running";
      what = fmt::format("rank {} (pid {}) {}", r, id.pid, says);
    }
    out += (out.empty() ? "" : "; ") + what;
  }
  return out.empty() ? "the other ranks are unknown" : out;
}

std::unique_ptr<Model> MakeStepLeader(std::unique_ptr<Model> inner, comm::Communicator& comm,
                                      std::chrono::seconds step_timeout,
                                      std::shared_ptr<ParallelJob> job) {
  if (!job) job = std::make_shared<ParallelJob>();
  auto ranks = ExchangeRankIdentities(comm, inner->info().weight_bytes);
  if (ranks.ok()) {
    job->SetRanks(std::move(ranks).value());
  } else {
    job->Fail(Cancelled("tensor parallelism: the ranks did not answer at start: {}",
                        ranks.status().message()));
  }
  return std::make_unique<StepLeader>(std::move(inner), comm, step_timeout, std::move(job));
}

Result<std::vector<RankIdentity>> ExchangeRankIdentities(comm::Communicator& comm,
                                                         uint64_t weight_bytes) {
  struct Wire {
    char host[64];
    int64_t pid;
    uint64_t weight_bytes;
  };
  Wire mine{};
  ::gethostname(mine.host, sizeof(mine.host) - 1);
  mine.pid = ::getpid();
  mine.weight_bytes = weight_bytes;
  std::vector<Wire> all(static_cast<size_t>(comm.Size()));
  DH_RETURN_IF_ERROR(comm.AllGather(&mine, sizeof(Wire), all.data()));
  std::vector<RankIdentity> ranks;
  for (Wire& w : all) {
    w.host[sizeof(w.host) - 1] = '\0';
    ranks.push_back({w.host, w.pid, w.weight_bytes});
  }
  return ranks;
}

Status FollowSteps(Model& model, Backend& backend, comm::Communicator& comm) {
  DH_RETURN_IF_ERROR(ExchangeRankIdentities(comm, model.info().weight_bytes).status());
  std::unique_ptr<KvStorage> kv;
  std::vector<float> logits;
  while (true) {
    Header h{};
    Batch batch;
    DH_RETURN_IF_ERROR(SendOrReceive(comm, h, batch));
    if (h[kKind] == 0) return Status::Ok();
    batch.logits_on_rank0_only = true;
    if (!kv || kv->num_blocks() != h[kNumBlocks] || kv->block_size() != h[kBlockSize]) {
      DH_ASSIGN_OR_RETURN(kv, KvStorage::Allocate(backend, model.kv_spec(),
                                                  static_cast<int>(h[kNumBlocks]),
                                                  static_cast<int>(h[kBlockSize])));
    }
    // The leader checked the batch; a failure here is this rank's own (and fatal for the job).
    DH_RETURN_IF_ERROR(model.Forward(batch, *kv, &logits));
    if (h[kReport] != 0) DH_RETURN_IF_ERROR(GatherMemory(comm).status());
  }
}

}  // namespace dh
