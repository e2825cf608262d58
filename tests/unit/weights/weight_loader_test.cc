// Where the weight loader puts the weights it converts: small tensors share buffers of
// kBufferChunkBytes (so on the CPU they lie in 2 MiB pages), each start 256-byte aligned and no
// two overlapping; a tensor of a quarter chunk or more gets a buffer of its own; the bytes are
// those QuantizeMatrix gives. A tensor used as stored from a checkpoint mapped only because it
// did not fit is copied out of the mapping while memory allows.
#include "weights/weight_loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "backend/buffer_chunks.h"
#include "backend/forwarding_backend.h"
#include "backend/reference/reference_backend.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "unit/io/io_test_util.h"

namespace dh {
namespace {

// Passes every call on, recording the size of each buffer handed out.
class CountingBackend : public ForwardingBackend {
 public:
  CountingBackend()
      : ForwardingBackend(std::make_unique<ReferenceBackend>(BackendOptions{})) {}
  std::unique_ptr<Buffer> Allocate(size_t bytes) override {
    sizes.push_back(bytes);
    return ForwardingBackend::Allocate(bytes);
  }
  std::vector<size_t> sizes;
};

std::vector<float> Values(int64_t n, float seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(seed + static_cast<float>(i) * 0.37f);
  return v;
}

TEST(WeightLoaderMemoryTest, SmallConvertedWeightsShareChunksLargeOnesGetTheirOwn) {
  testing::TempDir dir;  // a checkpoint of one tensor: the weights below come from the host
  std::vector<float> norm(8, 1.0f);
  std::vector<std::pair<std::string, Tensor>> tensors;
  tensors.push_back({"model.norm.weight", Tensor(norm.data(), DType::kF32, {8})});
  ASSERT_TRUE(WriteSafetensors(dir.File("model.safetensors"), tensors).ok());
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  WeightFlags flags;
  flags.quant = "int4";
  auto plan = ParseWeightPlan(flags);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  LoadOptions options;
  options.plan = *plan;
  ModelConfig config;
  CountingBackend backend;
  WeightLoader loader(*ckpt, config, backend, options);

  // 40 int4 weights [96, 200] (data, scales and zeros: three parts each, none a multiple of
  // 256 bytes) and 10 bf16 ones [33, 70], all far under a quarter chunk.
  constexpr int64_t kRows = 96, kCols = 200;
  std::vector<std::pair<const void*, size_t>> parts;
  std::vector<Weight> quantized;
  std::vector<std::vector<float>> sources;
  for (int i = 0; i < 40; ++i) {
    const std::string name = fmt::format("model.layers.{}.mlp.down_proj.weight", i);
    sources.push_back(Values(kRows * kCols, static_cast<float>(i)));
    auto w = loader.QuantizedFromHost(sources.back(), kRows, kCols, name);
    ASSERT_TRUE(w.ok()) << w.status().message();
    ASSERT_EQ(w->format, WeightFormat::kInt4);
    for (const Tensor* t : {&w->data, &w->scales, &w->zeros}) {
      if (!t->empty()) parts.push_back({t->data, t->nbytes()});
    }
    quantized.push_back(*w);
  }
  for (int i = 0; i < 10; ++i) {
    const std::vector<float> v = Values(33 * 70, 100.0f + i);
    auto w = loader.MatrixFromHost(v, 33, 70, DType::kBF16);
    ASSERT_TRUE(w.ok()) << w.status().message();
    parts.push_back({w->data.data, w->data.nbytes()});
  }
  ASSERT_EQ(backend.sizes, std::vector<size_t>{kBufferChunkBytes});

  // One tensor of exactly a quarter chunk: its own buffer of its own size, and the next small
  // tensor still goes into the first chunk.
  const int64_t big_cols = static_cast<int64_t>(kBufferChunkBytes / 4 / sizeof(float) / 64);
  const std::vector<float> big = Values(64 * big_cols, 7.0f);
  auto w_big = loader.MatrixFromHost(big, 64, big_cols, DType::kF32);
  ASSERT_TRUE(w_big.ok()) << w_big.status().message();
  EXPECT_EQ(std::memcmp(w_big->data.data, big.data(), kBufferChunkBytes / 4), 0);
  auto w_last = loader.MatrixFromHost(Values(16, 3.0f), 4, 4, DType::kF32);
  ASSERT_TRUE(w_last.ok()) << w_last.status().message();
  parts.push_back({w_last->data.data, w_last->data.nbytes()});
  EXPECT_EQ(backend.sizes, (std::vector<size_t>{kBufferChunkBytes, kBufferChunkBytes / 4}));

  // Every small part lies in the first chunk (the first part starts it), starts 256-byte
  // aligned, and overlaps no other.
  const auto* lo = static_cast<const uint8_t*>(parts.front().first);
  std::sort(parts.begin(), parts.end());
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto* p = static_cast<const uint8_t*>(parts[i].first);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u) << i;
    EXPECT_GE(p, lo) << i;
    EXPECT_LE(p + parts[i].second, lo + kBufferChunkBytes) << i;
    if (i + 1 < parts.size()) {
      EXPECT_LE(p + parts[i].second, static_cast<const uint8_t*>(parts[i + 1].first)) << i;
    }
  }

  // The carved copies hold what QuantizeMatrix gives, byte for byte (checked after all the
  // writes, so no later weight overwrote an earlier one).
  for (size_t i = 0; i < quantized.size(); ++i) {
    auto q = QuantizeMatrix(sources[i], kRows, kCols, options.plan.policy.FormatFor(
        fmt::format("model.layers.{}.mlp.down_proj.weight", i)).quant, "w");
    ASSERT_TRUE(q.ok()) << q.status().message();
    const Weight want = q->View();
    for (auto [got, exp] : {std::pair{&quantized[i].data, &want.data},
                            std::pair{&quantized[i].scales, &want.scales},
                            std::pair{&quantized[i].zeros, &want.zeros}}) {
      ASSERT_EQ(got->nbytes(), exp->nbytes()) << i;
      EXPECT_EQ(std::memcmp(got->data, exp->data, exp->nbytes()), 0) << i;
    }
  }
}

// A checkpoint mapped only because it exceeds the memory left (DEEPHARNESS_MEM_AVAILABLE
// simulates the machine): the embedding table, used as stored, is copied out of the mapping (same
// bytes, another address) while the copy leaves a quarter of that memory free; with less memory
// it stays in the mapping, and so it does when the user asked for --mmap.
TEST(WeightLoaderMemoryTest, TensorsUsedAsStoredLeaveACheckpointMappedToFit) {
  testing::TempDir dir;
  constexpr int64_t kVocab = 256, kHidden = 32;  // a 16 KiB bf16 table
  std::vector<uint16_t> table(kVocab * kHidden);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<uint16_t>(0x3f00 + i % 97);
  std::vector<float> unused(16384, 0.5f);  // 64 KiB never loaded: the checkpoint is ~80 KiB
  std::vector<std::pair<std::string, Tensor>> tensors;
  tensors.push_back({"model.embed_tokens.weight",
                     Tensor(table.data(), DType::kBF16, {kVocab, kHidden})});
  tensors.push_back({"unused.weight", Tensor(unused.data(), DType::kF32, {128, 128})});
  ASSERT_TRUE(WriteSafetensors(dir.File("model.safetensors"), tensors).ok());
  const std::string name = "model.embed_tokens.weight";
  const size_t table_bytes = table.size() * sizeof(uint16_t);
  ModelConfig config;

  // Loads the table from a checkpoint opened with `use_mmap` while DEEPHARNESS_MEM_AVAILABLE is
  // `available`; returns whether the weight still points into the mapping (and its bytes agree).
  auto stays_mapped = [&](bool use_mmap, const char* available) {
    EXPECT_EQ(setenv("DEEPHARNESS_MEM_AVAILABLE", available, 1), 0);
    auto ckpt = Checkpoint::Open(dir.path(), FileLoadOptions{.use_mmap = use_mmap});
    EXPECT_TRUE(ckpt.ok()) << ckpt.status().message();
    if (!ckpt.ok()) return true;
    EXPECT_EQ(ckpt->mapped_to_fit(), !use_mmap);  // every `available` here is under the file
    CountingBackend backend;
    WeightLoader loader(*ckpt, config, backend, LoadOptions{});
    auto w = loader.Matrix(name, kVocab, kHidden);
    unsetenv("DEEPHARNESS_MEM_AVAILABLE");
    EXPECT_TRUE(w.ok()) << w.status().message();
    if (!w.ok()) return true;
    EXPECT_EQ(w->data.dtype, DType::kBF16);
    EXPECT_EQ(w->data.nbytes(), table_bytes);
    EXPECT_EQ(std::memcmp(w->data.data, table.data(), table_bytes), 0);
    const bool in_mapping = w->data.data == ckpt->Find(name)->data;
    EXPECT_EQ(backend.sizes.empty(), in_mapping);  // a copy takes one backend buffer
    return in_mapping;
  };
  EXPECT_FALSE(stays_mapped(false, "72KiB"));  // 16 KiB copied, 56 left: over a quarter of 72
  EXPECT_TRUE(stays_mapped(false, "20KiB"));   // 16 KiB would leave 4, under 5 (a quarter)
  EXPECT_TRUE(stays_mapped(true, "72KiB"));    // --mmap: the user's choice stands
}

}  // namespace
}  // namespace dh
