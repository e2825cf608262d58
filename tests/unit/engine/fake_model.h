// Test doubles for engine tests: a Backend that only hands out host memory, a Model whose
// "KV cache" is the token id stored per slot (so a wrong block table or a reused block that was
// overwritten changes the output), and a character-per-token Tokenizer.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "backend/backend.h"
#include "base/check.h"
#include "engine/engine.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace dh::testing {

class HostBuffer : public Buffer {
 public:
  explicit HostBuffer(size_t n) : bytes_(n) {}
  void* data() override { return bytes_.data(); }
  size_t size() const override { return bytes_.size(); }

 private:
  std::vector<uint8_t> bytes_;
};

// The fake model never calls an op; only Allocate is reachable (and unused with 0 KV layers).
class NullBackend : public Backend {
 public:
  std::string name() const override { return "null"; }
  bool Supports(const OpDesc&) const override { return false; }
  std::unique_ptr<Buffer> Allocate(size_t bytes) override {
    return std::make_unique<HostBuffer>(bytes);
  }
  void CopyToDevice(const Tensor&, const void*) override { Fail(); }
  void CopyToHost(void*, const Tensor&) override { Fail(); }
  void Embedding(const Weight&, const Tensor&, Tensor) override { Fail(); }
  void RmsNorm(const Tensor&, const Tensor&, float, Tensor) override { Fail(); }
  void AddRmsNorm(Tensor, const Tensor&, const Tensor&, float, Tensor) override { Fail(); }
  void MatMul(const Tensor&, const Weight&, const Tensor&, Tensor) override { Fail(); }
  void BatchedMatMul(const Tensor&, std::span<const Weight>, Tensor) override { Fail(); }
  void Rope(Tensor, const Tensor&, const RopeParams&) override { Fail(); }
  void KvWrite(const Tensor&, const Tensor&, KvCacheView, KvCacheView, const Tensor&) override {
    Fail();
  }
  void Attention(const Tensor&, const KvCacheView&, const KvCacheView&, const AttentionMeta&,
                 float, Tensor) override {
    Fail();
  }
  void KvGather(const KvCacheView&, const Tensor&, Tensor) override { Fail(); }
  void SiluMul(const Tensor&, const Tensor&, Tensor) override { Fail(); }
  void Add(const Tensor&, const Tensor&, Tensor) override { Fail(); }
  void Copy(const Tensor&, Tensor) override { Fail(); }
  void GatherRows(const Tensor&, const Tensor&, Tensor) override { Fail(); }
  void MoeGate(const Tensor&, const Tensor&, const MoeGateParams&, Tensor, Tensor) override {
    Fail();
  }
  void MoeExperts(const Tensor&, const Tensor&, const Tensor&, std::span<const ExpertWeights>,
                  Tensor) override {
    Fail();
  }

 private:
  [[noreturn]] static void Fail() { DH_CHECK(false, "NullBackend ops are not callable"); }
};

enum class FakeMode {
  kSuccessor,    // favours (last token + 1) % vocab
  kContextHash,  // favours a hash of every token in the context, read back from the cache slots
};

// Logits row for position p of a sequence: the favoured token gets +8, every other token a
// pseudo-random value in [0, 4) derived from the context, so sampling at temperature 1 varies.
class FakeModel : public Model {
 public:
  FakeModel(int vocab, FakeMode mode, int max_positions = 4096) : mode_(mode) {
    config_.architecture = "FakeForCausalLM";
    config_.vocab_size = vocab;
    config_.max_position_embeddings = max_positions;
  }
  const ModelConfig& config() const override { return config_; }
  ModelConfig& mutable_config() { return config_; }
  KvCacheSpec kv_spec() const override { return KvCacheSpec(); }  // no device memory
  const ModelInfo& info() const override { return info_; }

  Status Forward(const Batch& batch, KvStorage& kv, std::vector<float>* logits) override {
    const int bs = kv.block_size();
    const size_t num_slots = static_cast<size_t>(kv.num_blocks()) * bs;
    if (slots_.size() != num_slots) slots_.assign(num_slots, -1);
    if (step_delay_.count() > 0) std::this_thread::sleep_for(step_delay_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      step_tokens_.push_back(batch.num_tokens());
      step_seqs_.push_back(batch.num_seqs());
    }
    for (int t = 0; t < batch.num_tokens(); ++t) {
      const int32_t slot = batch.slot_mapping[t];
      if (slot < 0 || static_cast<size_t>(slot) >= num_slots) {
        return Internal("slot {} out of range", slot);
      }
      slots_[slot] = batch.token_ids[t];
    }
    const int vocab = static_cast<int>(config_.vocab_size);
    logits->assign(batch.logits_rows.size() * static_cast<size_t>(vocab), 0.0f);
    for (size_t r = 0; r < batch.logits_rows.size(); ++r) {
      const int t = batch.logits_rows[r];
      int s = 0;
      while (batch.query_start[s + 1] <= t) ++s;
      const int pos = batch.positions[t];
      uint64_t h = 1469598103934665603ull;
      int32_t last = -1;
      for (int p = 0; p <= pos; ++p) {
        const int32_t block = batch.block_tables[s * batch.max_blocks_per_seq + p / bs];
        if (block < 0) return Internal("position {} has no block", p);
        last = slots_[static_cast<size_t>(block) * bs + p % bs];
        if (last < 0) return Internal("position {} read before it was written", p);
        h = (h ^ static_cast<uint64_t>(last)) * 1099511628211ull;
      }
      const int favoured =
          mode_ == FakeMode::kSuccessor ? (last + 1) % vocab : static_cast<int>(h % vocab);
      float* row = logits->data() + r * vocab;
      for (int i = 0; i < vocab; ++i) {
        const uint64_t x = (h + static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull) >> 40;
        row[i] = static_cast<float>(x % 4000) / 1000.0f;
      }
      row[favoured] += 8.0f;
    }
    return Status::Ok();
  }

  // Makes every step take at least `d`, so tests can act while a request is still running.
  void set_step_delay(std::chrono::milliseconds d) { step_delay_ = d; }

  std::vector<int> step_tokens() const {
    std::lock_guard<std::mutex> lock(mu_);
    return step_tokens_;
  }
  std::vector<int> step_seqs() const {
    std::lock_guard<std::mutex> lock(mu_);
    return step_seqs_;
  }

 private:
  FakeMode mode_;
  std::chrono::milliseconds step_delay_{0};
  ModelConfig config_;
  ModelInfo info_;
  std::vector<int32_t> slots_;
  mutable std::mutex mu_;
  std::vector<int> step_tokens_, step_seqs_;
};

// Token i < 26 is the letter 'a' + i, 26..51 'A'.., 52..61 digits, 62 a space, 63 "<eos>"
// (special); beyond 63, "<i>". Decoding concatenates the pieces.
class FakeTokenizer : public Tokenizer {
 public:
  static constexpr int32_t kEos = 63;
  explicit FakeTokenizer(int vocab) : vocab_(vocab) { config_.eos_token_id = kEos; }

  static std::string Piece(int32_t id) {
    if (id < 26) return std::string(1, static_cast<char>('a' + id));
    if (id < 52) return std::string(1, static_cast<char>('A' + id - 26));
    if (id < 62) return std::string(1, static_cast<char>('0' + id - 52));
    if (id == 62) return " ";
    if (id == kEos) return "<eos>";
    return "<" + std::to_string(id) + ">";
  }

  Result<std::vector<int32_t>> Encode(std::string_view text, bool) const override {
    std::vector<int32_t> ids;
    for (char c : text) {
      if (c >= 'a' && c <= 'z')
        ids.push_back(c - 'a');
      else if (c >= 'A' && c <= 'Z')
        ids.push_back(26 + c - 'A');
      else if (c >= '0' && c <= '9')
        ids.push_back(52 + c - '0');
      else if (c == ' ')
        ids.push_back(62);
      else
        return InvalidArgument("cannot encode '{}'", c);
    }
    return ids;
  }
  Result<std::string> Decode(std::span<const int32_t> ids, bool skip_special) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_) return OutOfRange("id {}", id);
      if (skip_special && IsSpecial(id)) continue;
      out += Piece(id);
    }
    return out;
  }
  int32_t vocab_size() const override { return vocab_; }
  std::optional<int32_t> TokenToId(std::string_view) const override { return std::nullopt; }
  std::optional<std::string> IdToToken(int32_t id) const override { return Piece(id); }
  bool IsSpecial(int32_t id) const override { return id == kEos; }
  const TokenizerConfig& config() const override { return config_; }

 private:
  int vocab_;
  TokenizerConfig config_;
};

// A deterministic prompt of `len` ids below 60, varied by `salt`.
inline std::vector<int32_t> Prompt(int len, int32_t salt) {
  std::vector<int32_t> p(len);
  for (int i = 0; i < len; ++i) p[i] = static_cast<int32_t>((i * 7 + salt * 13) % 60);
  return p;
}

// Submits a request to `engine`; null (and a test failure) when it is refused.
inline std::shared_ptr<RequestHandle> SubmitRequest(Engine& engine, std::vector<int32_t> prompt,
                                                    SamplingParams p, std::string id = "") {
  Request r;
  r.id = std::move(id);
  r.prompt_token_ids = std::move(prompt);
  r.sampling = std::move(p);
  auto h = engine.Submit(std::move(r));
  EXPECT_TRUE(h.ok()) << h.status().message();
  return h.ok() ? *h : nullptr;
}

// Waits (up to 5 s) until the engine thread has published an idle pool (everything freed).
inline EngineStats WaitEngineIdle(Engine& engine) {
  EngineStats s;
  for (int i = 0; i < 500; ++i) {
    s = engine.GetStats();
    if (s.num_running == 0 && s.num_waiting == 0 && s.kv_blocks_free == s.kv_blocks_total) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return s;
}

}  // namespace dh::testing
