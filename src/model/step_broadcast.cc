// Leader/follower step broadcast (step_broadcast.h).
#include "model/step_broadcast.h"

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "base/log.h"
#include "model/kv_storage.h"

namespace dh {
namespace {

// The header every step starts with; kind 0 stops the followers.
enum Field { kKind, kTokens, kSeqs, kMaxBlocks, kRows, kNumBlocks, kBlockSize, kNumFields };
using Header = std::array<int64_t, kNumFields>;

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

class StepLeader final : public Model {
 public:
  StepLeader(std::unique_ptr<Model> inner, comm::Communicator& comm, std::chrono::seconds timeout)
      : inner_(std::move(inner)), comm_(comm), timeout_(timeout) {
    watchdog_ = std::thread([this] { Watch(); });
  }
  ~StepLeader() override {
    Header h{};
    Batch none;
    Status st = SendOrReceive(comm_, h, none);
    if (!st.ok()) DH_LOG(Warning, "stopping the follower ranks: {}", st.message());
    const comm::CommStats& cs = comm_.Stats();
    DH_LOG(Info, "tensor parallelism: {} steps; rank 0 spent {:.3f} s in {} collectives ({:.1f} MiB)",
           step_, cs.seconds, cs.calls, cs.bytes / 1048576.0);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
  }

  const ModelConfig& config() const override { return inner_->config(); }
  KvCacheSpec kv_spec() const override { return inner_->kv_spec(); }
  const ModelInfo& info() const override { return inner_->info(); }

  Status Forward(const Batch& batch, KvStorage& kv, std::vector<float>* logits) override {
    Header h{1,
             batch.num_tokens(),
             batch.num_seqs(),
             batch.max_blocks_per_seq,
             static_cast<int64_t>(batch.logits_rows.size()),
             kv.num_blocks(),
             kv.block_size()};
    {
      std::lock_guard<std::mutex> lock(mu_);
      step_started_ = std::chrono::steady_clock::now();
      in_step_ = true;
      ++step_;
    }
    // Rank 0 only reads the batch (SendOrReceive writes into it on the followers).
    Status st = SendOrReceive(comm_, h, const_cast<Batch&>(batch));
    if (st.ok()) st = inner_->Forward(batch, kv, logits);
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_step_ = false;
    }
    return st;
  }

 private:
  // A collective never returns when a peer hangs (and may not when it dies): give up loudly.
  void Watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      cv_.wait_for(lock, std::chrono::seconds(1));
      if (in_step_ && std::chrono::steady_clock::now() - step_started_ > timeout_) {
        DH_LOG(Error, "tensor parallelism: step {} has not finished after {} s; a rank is dead "
                      "or hung; exiting", step_, timeout_.count());
        std::fprintf(stderr, "error: tensor-parallel step %llu timed out after %lld s (a rank "
                             "died or hangs)\n", static_cast<unsigned long long>(step_),
                     static_cast<long long>(timeout_.count()));
        std::_Exit(1);
      }
    }
  }

  std::unique_ptr<Model> inner_;
  comm::Communicator& comm_;
  std::chrono::seconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false, in_step_ = false;
  uint64_t step_ = 0;
  std::chrono::steady_clock::time_point step_started_;
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<Model> MakeStepLeader(std::unique_ptr<Model> inner, comm::Communicator& comm,
                                      std::chrono::seconds step_timeout) {
  return std::make_unique<StepLeader>(std::move(inner), comm, step_timeout);
}

Status FollowSteps(Model& model, Backend& backend, comm::Communicator& comm) {
  std::unique_ptr<KvStorage> kv;
  std::vector<float> logits;
  while (true) {
    Header h{};
    Batch batch;
    DH_RETURN_IF_ERROR(SendOrReceive(comm, h, batch));
    if (h[kKind] == 0) return Status::Ok();
    if (!kv || kv->num_blocks() != h[kNumBlocks] || kv->block_size() != h[kBlockSize]) {
      DH_ASSIGN_OR_RETURN(kv, KvStorage::Allocate(backend, model.kv_spec(),
                                                  static_cast<int>(h[kNumBlocks]),
                                                  static_cast<int>(h[kBlockSize])));
    }
    // The leader checked the batch; a failure here is this rank's own (and fatal for the job).
    DH_RETURN_IF_ERROR(model.Forward(batch, *kv, &logits));
  }
}

}  // namespace dh
