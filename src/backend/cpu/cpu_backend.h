// CpuBackend: Highway kernels (runtime SIMD dispatch) on a persistent ThreadPool. Ops it does not
// accelerate fall back to ReferenceBackend, and Supports() says false for them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "backend/buffer_chunks.h"
#include "backend/reference/reference_backend.h"
#include "base/thread_pool.h"

namespace dh {

class CpuBackend : public ReferenceBackend {
 public:
  explicit CpuBackend(const BackendOptions& options);
  ~CpuBackend() override;

  std::string name() const override { return "cpu"; }
  // "target=<Highway target> tiles=<int-v1|off> cpu=<the CPU's SIMD features>" (compile-cache
  // key: a cache holds int4 weights as this build's tiles where PrepackWanted).
  std::string KernelTag() const override;
  bool Supports(const OpDesc& op) const override;
  // Head by head (Backend::KvCacheHeadMajor): decode then reads a kv head's keys (and values)
  // a whole 16-slot block at a time, not a 512-byte row every heads x dim elements
  // (bench/README.md "Zen 5, session 41").
  bool KvCacheHeadMajor() const override { return true; }
  // int8 / int4 weights the integer kernels take get a prepacked copy beside the row layout
  // (quant_vnni.h "Prepacked tiles"; PrepackWanted says when); others pass unchanged. An int4
  // weight whose tiles serve every row count (ReadsPrepackedTiles) then gives its row layout
  // back (Weight::rows_released), unless read_by_rows, BackendOptions::release_rows = false or
  // a hold (HoldReleases) keeps it.
  // A weight that arrives with tiles (a compile cache) keeps them (AdoptTiles).
  Result<Weight> PrepareWeight(const Weight& w) override;
  bool PackedServesEveryProduct(const Weight& w) const override;
  // Bytes of tiles PrepareWeight has packed itself (not those a compile cache handed over).
  uint64_t tiles_packed_bytes() const { return tiles_packed_bytes_.load(); }
  // Products MatMuls ran over one shared preparation of x (counted for tests and traces).
  uint64_t shared_x_products() const { return shared_x_products_.load(); }
  void HoldReleases() override;
  void ReleaseHeldRows() override;

  ThreadPool& pool() { return *pool_; }

  void Embedding(const Weight& table, const Tensor& ids, Tensor out) override;
  void RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor out) override;
  void AddRmsNorm(Tensor residual, const Tensor& x, const Tensor& weight, float eps,
                  Tensor out) override;
  void MatMul(const Tensor& x, const Weight& w, const Tensor& bias, Tensor out) override;
  // Weights that take the integer dot products with the same quantization of x: x quantized
  // once, every weight's rows in one parallel loop (the bits of MatMul weight by weight);
  // otherwise one MatMul per weight.
  void MatMuls(const Tensor& x, std::span<const MatMulTarget> targets) override;
  // Decode (few rows): one parallel loop over every head's output rows on the GEMV kernel;
  // otherwise one MatMul per head.
  void BatchedMatMul(const Tensor& x, std::span<const Weight> w, Tensor out) override;
  // Every KV cache dtype, dequantized inside the kernel (cpu_kernels.h Attend).
  void Attention(const Tensor& q, const KvCacheView& k_cache, const KvCacheView& v_cache,
                 const AttentionMeta& meta, float scale, Tensor out) override;
  void SiluMul(const Tensor& gate, const Tensor& up, Tensor out) override;
  void Add(const Tensor& a, const Tensor& b, Tensor out) override;
  // The router, and the tokens grouped by expert with the expert FFNs through MatMul, over
  // reusable scratch (cpu_moe.cc).
  void MoeGate(const Tensor& logits, const Tensor& bias, const MoeGateParams& p, Tensor topk_ids,
               Tensor topk_weights) override;
  void MoeExperts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                  std::span<const ExpertWeights> experts, Tensor out) override;
  // Rope, KvWrite and KvGather: the SIMD kernels of rope_kv.cc, bit-identical to the reference
  // (cpu_rope_kv.cc). Copy and GatherRows are the reference backend's loops, inherited (traced as
  // kernel "reference"; --trace-kernels logs only the ops with a CPU kernel).
  void Rope(Tensor x, const Tensor& positions, const RopeParams& p) override;
  void KvWrite(const Tensor& k, const Tensor& v, KvCacheView k_cache, KvCacheView v_cache,
               const Tensor& slot_mapping) override;
  void KvGather(const KvCacheView& cache, const Tensor& slots, Tensor out) override;

 private:
  // With trace_kernels, logs `what` the first time it is seen.
  void Trace(const std::string& what);
  // The same, formatted only when tracing: a decode step without --trace-kernels allocates
  // nothing here (tests/alloc).
  template <typename... Args>
  void Trace(fmt::format_string<Args...> f, Args&&... args) {
    if (options().trace_kernels) Trace(fmt::format(f, std::forward<Args>(args)...));
  }

  // MatMul and SiluMul on a given pool: the backend's, or inline_pool_ inside one of its
  // workers (MoeExperts runs whole experts per worker when each has few tokens).
  void MatMulOn(ThreadPool& pool, const Tensor& x, const Weight& w, const Tensor& bias,
                Tensor out);
  void MatMulsOn(ThreadPool& pool, const Tensor& x, std::span<const MatMulTarget> targets);
  void SiluMulOn(ThreadPool& pool, const Tensor& gate, const Tensor& up, Tensor out);
  // BatchedMatMul's heads (dense, one type and shape) as one cpu::GemmBatched call.
  void BatchedGemm(const Tensor& x, std::span<const Weight> w, Tensor out);
  // One expert's SwiGLU FFN over its grouped rows [r0, r0 + n) of moe_'s scratch.
  void ExpertFfn(ThreadPool& pool, const ExpertWeights& ew, int64_t r0, int64_t n,
                 int64_t hidden, int64_t inter);

  // The bytes of w's prepacked tiles on this load (PrepackWanted, a layout they take); 0: none.
  size_t TileBytes(const Weight& w) const;
  // Whether an int4 weight's tiles at `tiles` serve every number of rows of x on this load
  // (ReadsPrepackedTiles, the integer path on, not a table, release_rows), so that its rows
  // need not stay.
  bool TilesServeEveryProduct(const Weight& w, const uint8_t* tiles) const;
  // w with its rows handed back (or held) where its tiles serve every product.
  Weight ReleaseServedRows(Weight w);
  // PrepareWeight of a weight that arrives with tiles (compile cache): checked, kept.
  Result<Weight> AdoptTiles(const Weight& w);

  std::unique_ptr<ThreadPool> pool_;
  std::mutex prepacked_mu_;
  BufferChunks prepacked_{64};  // PrepareWeight's copies, kept while the backend lives
  bool hold_releases_ = false;  // HoldReleases: under prepacked_mu_, as held_rows_
  std::vector<std::pair<const void*, size_t>> held_rows_;
  std::atomic<bool> prepack_skipped_{false};         // logged once when memory ran short
  std::atomic<uint64_t> tiles_packed_bytes_{0};
  std::atomic<uint64_t> shared_x_products_{0};
  // A one-thread pool: everything it is given runs on the calling thread and it keeps no state
  // while doing so, so the pool's workers may all use it at once.
  std::unique_ptr<ThreadPool> inline_pool_;
  // MoeExperts' grouping and activations, grown to the largest step seen and reused.
  struct MoeScratch {
    std::vector<int32_t> start;         // [experts + 1]: first grouped row of each expert
    std::vector<int32_t> fill;          // [experts]: rows placed so far (the sort's cursor)
    std::vector<int32_t> row_of_pair;   // [T * k]: grouped row of pair t * k + i, or -1
    std::vector<int32_t> token_of_row;  // [rows]: the token a grouped row comes from
    std::vector<int32_t> order;         // experts with rows, most rows first (expert-parallel)
    std::vector<float> xs, gate, up, ys;
  };
  MoeScratch moe_;
  // MoeGate's per-token work arrays.
  struct GateScratch {
    std::vector<float> scores, choice, group_scores;
    std::vector<uint8_t> taken, group_taken;
    std::vector<int> chosen;
  };
  GateScratch gate_;
  // Attention's slot lists and work items (a block of query rows of one sequence and kv head).
  struct AttentionItem {
    int32_t seq, kvh, row0, rows;
    int64_t key_begin, key_end;  // the part of the keys this item sees
    int64_t partial;             // offset of its partial sums in partial, or -1: none
    int64_t cost;  // keys x row vectors x (dk + dv): the order items are handed out in
  };
  // A row block whose keys were cut into `parts` ranges, their partial sums from `partial` on,
  // each [rows][dv] outputs, [rows] maxima, [rows] sums.
  struct AttentionSplit {
    int32_t seq, kvh, row0, rows;
    int64_t partial;
    int32_t parts;
  };
  struct AttentionScratch {
    std::vector<int64_t> slots, slot_start;
    std::vector<AttentionItem> items;
    std::vector<AttentionSplit> splits;
    std::vector<size_t> groups;  // items [groups[g], groups[g + 1]) run together
    std::vector<float> partial;
  };
  AttentionScratch attn_;
  // Rope's cos and sin [tokens, rot_dim / 2] and the inputs they were computed from.
  struct RopeScratch {
    std::vector<int32_t> positions;
    std::vector<float> inv_freq, cos, sin;
    uint32_t factor_bits = 0;  // attention_factor's bits
  };
  RopeScratch rope_;
  std::mutex trace_mu_;
  std::set<std::string> traced_;
};

}  // namespace dh
