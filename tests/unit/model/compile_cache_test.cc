// Compile cache (weights/compile_cache*.h, model/load_model.cc): logits from a cached load are
// bitwise equal to a checkpoint load (dense, FP8, int4; Llama, Qwen2, DeepSeek with MLA's derived
// weights); a hit reads no tensor data; a stale key (mtime, options, CPU target) or a damaged file
// (truncated, bad magic, version, out-of-bounds regions, flipped bytes) is ignored with a reason
// and the model loads from the checkpoint; concurrent writers leave one complete file.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <xxhash.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/buffer_chunks.h"
#include "backend/cpu/quant_vnni.h"
#include "base/memory_info.h"
#include "model/model.h"
#include "model/sequence_runner.h"
#include "weights/compile_cache.h"
#include "weights/weight_plan.h"

namespace dh {
namespace {

namespace fs = std::filesystem;
using Outcome = CompileCacheResult::Outcome;

const fs::path kFixtures = fs::path(DH_SOURCE_DIR) / "tests/golden/fixtures";
const std::vector<int32_t> kPrompt = {73, 99, 151, 176, 26, 250, 230, 84, 58, 150, 197, 139};

// A fresh directory under the system temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> n{0};
    path_ = fs::temp_directory_path() /
            ("dh_compile_cache_test_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

struct Loaded {
  std::vector<float> logits;
  ModelInfo info;
  CompileCacheResult cache;
  uint64_t tiles_packed = 0;  // bytes of tiles the backend packed on this load
};

struct Opts {
  std::string quant = "none";
  std::string mla_mode = "auto";
  std::string policy;
  std::string cache_dir;  // "" = no cache
  CompileCacheOptions::Write write = CompileCacheOptions::Write::kNever;
  bool force = false;
  bool mmap = false;
  std::string kernel_tag = "test-target";
  bool release_rows = true;      // BackendOptions::release_rows
  bool hold = false;             // HoldReleases during the load and the forward pass
  bool integer_dot_off = false;  // the forward pass on the f32 kernels (which read the rows)
};

// A CPU backend with a chosen KernelTag(), standing in for another machine's SIMD target.
class TaggedCpuBackend : public CpuBackend {
 public:
  TaggedCpuBackend(const BackendOptions& o, std::string tag) : CpuBackend(o), tag_(std::move(tag)) {}
  std::string KernelTag() const override { return tag_; }

 private:
  std::string tag_;
};

Result<Loaded> Load(const fs::path& model_dir, const Opts& opts) {
  BackendOptions bo;
  bo.num_threads = 2;
  bo.release_rows = opts.release_rows;
  TaggedCpuBackend backend(bo, opts.kernel_tag);
  if (opts.hold) backend.HoldReleases();
  Loaded out;
  LoadOptions o;
  DH_ASSIGN_OR_RETURN(o.plan, ParseWeightPlan({.quant = opts.quant, .policy = opts.policy}));
  DH_ASSIGN_OR_RETURN(o.plan.mla_mode, ParseMlaMode(opts.mla_mode));
  o.file.use_mmap = opts.mmap;
  o.compile_cache.dir = opts.cache_dir;
  o.compile_cache.write = opts.write;
  o.compile_cache.force = opts.force;
  o.compile_cache.result = &out.cache;
  DH_ASSIGN_OR_RETURN(auto model, LoadModel(model_dir.string(), backend, o));
  out.info = model->info();
  out.tiles_packed = backend.tiles_packed_bytes();
  DH_ASSIGN_OR_RETURN(auto runner,
                      SequenceRunner::Create(*model, backend, static_cast<int>(kPrompt.size())));
  if (opts.integer_dot_off) cpu::SetIntegerDotForTest(cpu::IntegerDot::kOff);
  auto logits = runner->Feed(kPrompt, /*all_logits=*/true);
  cpu::SetIntegerDotForTest(cpu::IntegerDot::kAuto);
  if (opts.hold) backend.ReleaseHeldRows();
  DH_ASSIGN_OR_RETURN(out.logits, std::move(logits));
  return out;
}

void ExpectSameInfo(const ModelInfo& a, const ModelInfo& b) {
  EXPECT_EQ(a.num_parameters, b.num_parameters);
  EXPECT_EQ(a.num_tensors, b.num_tensors);
  EXPECT_EQ(a.weight_bytes, b.weight_bytes);
  EXPECT_EQ(a.active_weight_bytes_per_token, b.active_weight_bytes_per_token);
  EXPECT_EQ(a.skipped_tensors, b.skipped_tensors);
  EXPECT_EQ(a.bytes_by_dtype, b.bytes_by_dtype);
}

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Copies a fixture so tests may touch or rewrite its files.
fs::path CopyFixture(const std::string& name, const fs::path& dest) {
  const fs::path dir = dest / name;
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(kFixtures / name)) {
    fs::copy_file(e.path(), dir / e.path().filename());
  }
  return dir;
}

std::vector<uint8_t> ReadBytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const fs::path& p, const std::vector<uint8_t>& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// Header field offsets (FileHeader in compile_cache.cc).
constexpr size_t kVersionAt = 8, kFileBytesAt = 24, kTableOffsetAt = 64, kTableBytesAt = 72,
                 kTableHashAt = 144, kHeaderHashAt = 160;

uint64_t GetU64(const std::vector<uint8_t>& b, size_t at) {
  uint64_t v;
  std::memcpy(&v, b.data() + at, 8);
  return v;
}
void PutU64(std::vector<uint8_t>& b, size_t at, uint64_t v) { std::memcpy(b.data() + at, &v, 8); }

void PutHash(std::vector<uint8_t>& b, size_t at, const void* p, size_t n) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(p, n));
  std::memcpy(b.data() + at, c.digest, 16);
}
void FixHeaderHash(std::vector<uint8_t>& b) { PutHash(b, kHeaderHashAt, b.data(), kHeaderHashAt); }
void FixTableHash(std::vector<uint8_t>& b) {
  PutHash(b, kTableHashAt, b.data() + GetU64(b, kTableOffsetAt), GetU64(b, kTableBytesAt));
  FixHeaderHash(b);
}

fs::path OnlyCacheFile(const fs::path& dir) {
  fs::path found;
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".dhc") {
      found = e.path();
      ++n;
    }
  }
  EXPECT_EQ(n, 1) << "cache files in " << dir;
  return found;
}

TEST(CompileCacheTest, CachedLogitsAreBitwiseEqual) {
  const struct {
    const char* fixture;
    const char* quant;
    const char* mla_mode;
    const char* policy = "";
  } kCases[] = {
      {"llama_f32", "none", "auto"},       {"llama_f32", "int4", "auto"},
      {"llama_bf16_tied", "none", "auto"}, {"qwen2_sharded", "none", "auto"},
      {"qwen2_f32", "int8", "auto"},       {"ds_v2_lite", "none", "absorbed"},
      {"ds_v2_lite", "int4", "auto"},      {"ds_v3_fp8", "none", "absorbed"},
      {"ds_v3_fp8", "int4", "auto"},       {"ds_moe", "none", "auto"},
      {"ds_v3_mtp", "none", "auto"},       {"qwen2_gptq_actorder", "none", "auto"},
      {"llama_awq", "none", "auto"},       {"ds_v2_lite_awq", "none", "absorbed"},
      {"llama_f32", "none", "auto", "static:fp8"},
      {"ds_v2_lite", "none", "auto", "custom:mla=int8,experts=int4,default=bf16"},
      {"llama_bf16_tied", "none", "auto", "custom:lm_head=int8"},  // a quantized lm_head copy
  };
  for (const auto& c : kCases) {
    SCOPED_TRACE(std::string(c.fixture) + " quant=" + c.quant + " mla=" + c.mla_mode +
                 " policy=" + c.policy);
    if (!fs::exists(kFixtures / c.fixture)) continue;
    Opts plain;
    plain.quant = c.quant;
    plain.mla_mode = c.mla_mode;
    plain.policy = c.policy;
    auto want = Load(kFixtures / c.fixture, plain);
    if (!want.ok() && (std::string(c.fixture).find("awq") != std::string::npos ||
                       std::string(c.fixture).find("gptq") != std::string::npos ||
                       c.policy[0] != '\0')) {
      std::printf("skipped %s %s: %s\n", c.fixture, c.policy, want.status().message().c_str());
      continue;  // packed-int4 loading or this policy is not in this build
    }
    ASSERT_TRUE(want.ok()) << want.status().message();
    EXPECT_EQ(want->cache.outcome, Outcome::kOff);

    TempDir cache;
    Opts write = plain;
    write.cache_dir = cache.path().string();
    write.write = CompileCacheOptions::Write::kAlways;
    auto written = Load(kFixtures / c.fixture, write);
    ASSERT_TRUE(written.ok()) << written.status().message();
    ASSERT_EQ(written->cache.outcome, Outcome::kWritten) << written->cache.reason;
    EXPECT_TRUE(BitwiseEqual(written->logits, want->logits));
    EXPECT_EQ(OnlyCacheFile(cache.path()).string(), written->cache.path);

    for (bool mmap : {false, true}) {
      Opts read = write;
      read.write = CompileCacheOptions::Write::kNever;
      read.mmap = mmap;
      auto got = Load(kFixtures / c.fixture, read);
      ASSERT_TRUE(got.ok()) << got.status().message();
      ASSERT_EQ(got->cache.outcome, Outcome::kHit) << got->cache.reason;
      EXPECT_GT(got->cache.file_bytes, 4096u);
      EXPECT_TRUE(BitwiseEqual(got->logits, want->logits)) << "mmap=" << mmap;
      ExpectSameInfo(got->info, want->info);
    }
  }
}

// Where this CPU's integer kernel reads int4 weights from prepacked tiles alone, the
// file holds those tiles in place of the rows: a cached load, read or mapped, packs none and gives
// the same logits. A load that needs the rows (held for the self-check, release_rows off) gets
// them rebuilt from the tiles: the f32 kernels, which read the rows, then give the checkpoint
// load's logits bit for bit.
TEST(CompileCacheTest, Int4TilesComeFromTheFile) {
  // A machine with little memory left takes no chunk for the tiles (PrepareWeight's headroom).
  const MemoryInfo mem = ReadMemoryInfo();
  const bool tiles = cpu::PrepackWanted(/*int4=*/true) &&
                     (mem.available == 0 ||
                      mem.available >= kBufferChunkBytes + cpu::kPrepackHeadroomBytes);
  for (const char* fixture : {"ds_v2_lite", "llama_f32"}) {
    SCOPED_TRACE(fixture);
    TempDir cache;
    Opts plain;
    plain.quant = "int4";
    auto want = Load(kFixtures / fixture, plain);
    ASSERT_TRUE(want.ok()) << want.status().message();
    EXPECT_EQ(want->tiles_packed > 0, tiles);
    Opts write = plain;
    write.cache_dir = cache.path().string();
    write.write = CompileCacheOptions::Write::kAlways;
    auto written = Load(kFixtures / fixture, write);
    ASSERT_TRUE(written.ok()) << written.status().message();
    ASSERT_EQ(written->cache.outcome, Outcome::kWritten) << written->cache.reason;
    for (bool mmap : {false, true}) {
      Opts read = write;
      read.write = CompileCacheOptions::Write::kNever;
      read.mmap = mmap;
      auto got = Load(kFixtures / fixture, read);
      ASSERT_TRUE(got.ok()) << got.status().message();
      ASSERT_EQ(got->cache.outcome, Outcome::kHit) << got->cache.reason;
      EXPECT_EQ(got->tiles_packed, 0u) << "mmap=" << mmap;
      EXPECT_TRUE(BitwiseEqual(got->logits, want->logits)) << "mmap=" << mmap;
    }
    Opts rows = plain;
    rows.release_rows = false;
    rows.integer_dot_off = true;
    auto f32 = Load(kFixtures / fixture, rows);
    ASSERT_TRUE(f32.ok()) << f32.status().message();
    for (bool hold : {false, true}) {
      Opts read = write;
      read.write = CompileCacheOptions::Write::kNever;
      read.release_rows = hold;
      read.hold = hold;
      read.integer_dot_off = true;
      auto got = Load(kFixtures / fixture, read);
      ASSERT_TRUE(got.ok()) << got.status().message();
      ASSERT_EQ(got->cache.outcome, Outcome::kHit) << got->cache.reason;
      EXPECT_EQ(got->tiles_packed, 0u) << "hold=" << hold;
      EXPECT_TRUE(BitwiseEqual(got->logits, f32->logits)) << "hold=" << hold;
    }
  }
  if (!tiles) std::printf("this CPU's integer kernel makes no tiles: rows only in the file\n");
}

TEST(CompileCacheTest, HitReadsNoTensorData) {
  // Overwrite the checkpoint's tensor bytes but keep its size, header and mtime: the key cannot
  // see it, so the cache is used and the logits are those of the original weights.
  TempDir tmp;
  const fs::path model = CopyFixture("llama_f32", tmp.path());
  auto want = Load(model, Opts{});
  ASSERT_TRUE(want.ok()) << want.status().message();
  Opts write;
  write.cache_dir = (tmp.path() / "cache").string();
  write.write = CompileCacheOptions::Write::kAlways;
  ASSERT_EQ(Load(model, write)->cache.outcome, Outcome::kWritten);

  const fs::path st = model / "model.safetensors";
  struct stat before;
  ASSERT_EQ(::stat(st.c_str(), &before), 0);
  auto bytes = ReadBytes(st);
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  for (size_t i = 8 + header; i < bytes.size(); ++i) bytes[i] = 0x7f;  // NaN-ish floats
  WriteBytes(st, bytes);
  const struct timespec times[2] = {before.st_atim, before.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, st.c_str(), times, 0), 0);

  Opts read = write;
  read.write = CompileCacheOptions::Write::kNever;
  auto got = Load(model, read);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(got->cache.outcome, Outcome::kHit) << got->cache.reason;
  EXPECT_TRUE(BitwiseEqual(got->logits, want->logits));
}

TEST(CompileCacheTest, StaleKeysAreNotUsed) {
  TempDir tmp;
  const fs::path model = CopyFixture("llama_f32", tmp.path());
  auto want = Load(model, Opts{});
  ASSERT_TRUE(want.ok()) << want.status().message();
  Opts write;
  write.cache_dir = (tmp.path() / "cache").string();
  write.write = CompileCacheOptions::Write::kAlways;
  ASSERT_EQ(Load(model, write)->cache.outcome, Outcome::kWritten);
  Opts read = write;
  read.write = CompileCacheOptions::Write::kNever;

  // Another SIMD target: same file name, other key.
  Opts other_target = read;
  other_target.kernel_tag = "another-target";
  auto got = Load(model, other_target);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(got->cache.outcome, Outcome::kNotUsed);
  EXPECT_NE(got->cache.reason.find("another-target"), std::string::npos) << got->cache.reason;
  EXPECT_TRUE(BitwiseEqual(got->logits, want->logits));

  // Other weight options: another file name, so no file.
  Opts other_quant = read;
  other_quant.quant = "int8";
  got = Load(model, other_quant);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(got->cache.outcome, Outcome::kAbsent);
  // ... and the key itself differs, were the file renamed.
  LoadOptions a, b;
  b.plan = *ParseWeightPlan({.quant = "int8"});
  auto ka = CompileCacheKey(model.string(), a, "cpu", "");
  auto kb = CompileCacheKey(model.string(), b, "cpu", "");
  ASSERT_TRUE(ka.ok() && kb.ok());
  EXPECT_NE(*ka, *kb);
  EXPECT_NE(CompileCachePath("/c", model.string(), a, "cpu"),
            CompileCachePath("/c", model.string(), b, "cpu"));
  EXPECT_NE(CompileCachePath("/c", model.string(), a, "cpu"),
            CompileCachePath("/c", model.string(), a, "reference"));

  // Touching the checkpoint (new mtime) makes the file stale; kReplaceStale rewrites it.
  const fs::path st = model / "model.safetensors";
  struct stat before;
  ASSERT_EQ(::stat(st.c_str(), &before), 0);
  struct timespec times[2] = {before.st_atim, before.st_mtim};
  times[1].tv_sec += 10;
  ASSERT_EQ(::utimensat(AT_FDCWD, st.c_str(), times, 0), 0);
  got = Load(model, read);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(got->cache.outcome, Outcome::kNotUsed);
  EXPECT_NE(got->cache.reason.find("model.safetensors"), std::string::npos) << got->cache.reason;
  EXPECT_NE(got->cache.reason.find("mtime_ns"), std::string::npos) << got->cache.reason;
  EXPECT_TRUE(BitwiseEqual(got->logits, want->logits));

  Opts replace = read;
  replace.write = CompileCacheOptions::Write::kReplaceStale;
  got = Load(model, replace);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(got->cache.outcome, Outcome::kWritten) << got->cache.reason;
  got = Load(model, read);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(got->cache.outcome, Outcome::kHit) << got->cache.reason;
  EXPECT_TRUE(BitwiseEqual(got->logits, want->logits));

  // A changed config.json is seen too.
  {
    std::ofstream(model / "config.json", std::ios::app) << "\n";
  }
  got = Load(model, read);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(got->cache.outcome, Outcome::kNotUsed);
  EXPECT_NE(got->cache.reason.find("config.json"), std::string::npos) << got->cache.reason;
}

TEST(CompileCacheTest, DamagedFilesAreIgnored) {
  TempDir tmp;
  const fs::path model = kFixtures / "ds_v2_lite";
  Opts plain;
  plain.quant = "int4";
  auto want = Load(model, plain);
  ASSERT_TRUE(want.ok()) << want.status().message();
  Opts write = plain;
  write.cache_dir = tmp.path().string();
  write.write = CompileCacheOptions::Write::kAlways;
  auto written = Load(model, write);
  ASSERT_TRUE(written.ok() && written->cache.outcome == Outcome::kWritten);
  const fs::path path = written->cache.path;
  const std::vector<uint8_t> good = ReadBytes(path);
  Opts read = write;
  read.write = CompileCacheOptions::Write::kNever;

  const struct {
    const char* what;
    std::function<void(std::vector<uint8_t>&)> damage;
    const char* reason;  // expected in the log reason
  } kCases[] = {
      {"truncated", [](auto& b) { b.resize(b.size() - 100); }, "truncated"},
      {"cut inside the header", [](auto& b) { b.resize(100); }, "shorter than"},
      {"empty", [](auto& b) { b.clear(); }, "shorter than"},
      {"bad magic", [](auto& b) { b[0] = 'X'; }, "magic"},
      {"other version",
       [](auto& b) {
         b[kVersionAt] += 1;
         FixHeaderHash(b);
       },
       "version"},
      // A file of the previous format (no packed copies: version 3).
      {"older version",
       [](auto& b) {
         b[kVersionAt] -= 1;
         FixHeaderHash(b);
       },
       "(written by an older build), this build reads version 4 only: recompile it with "
       "`deepharness compile`"},
      {"header bit flip", [](auto& b) { b[40] ^= 1; }, "header checksum"},
      {"table out of bounds",
       [](auto& b) {
         PutU64(b, kTableBytesAt, GetU64(b, kTableBytesAt) + 4096);
         FixHeaderHash(b);
       },
       "out of bounds"},
      {"file size lies",
       [](auto& b) {
         PutU64(b, kFileBytesAt, GetU64(b, kFileBytesAt) * 2);
         FixHeaderHash(b);
       },
       "the header says"},
      {"table bit flip", [](auto& b) { b[GetU64(b, kTableOffsetAt) + 20] ^= 4; },
       "table checksum"},
      {"table truncated with a valid checksum",
       [](auto& b) {
         PutU64(b, kTableBytesAt, GetU64(b, kTableBytesAt) - 9);
         b.resize(b.size() - 9);
         PutU64(b, kFileBytesAt, b.size());
         FixTableHash(b);
       },
       "table"},
  };
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.what);
    std::vector<uint8_t> bad = good;
    c.damage(bad);
    WriteBytes(path, bad);
    for (bool mmap : {false, true}) {
      read.mmap = mmap;
      auto got = Load(model, read);
      ASSERT_TRUE(got.ok()) << got.status().message();
      EXPECT_EQ(got->cache.outcome, Outcome::kNotUsed);
      EXPECT_NE(got->cache.reason.find(c.reason), std::string::npos) << got->cache.reason;
      EXPECT_TRUE(BitwiseEqual(got->logits, want->logits));
    }
  }
  // A directory where the file should be.
  fs::remove(path);
  fs::create_directories(path);
  auto got = Load(model, read);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(got->cache.outcome, Outcome::kNotUsed);
  fs::remove_all(path);

  // The good bytes again: used.
  WriteBytes(path, good);
  got = Load(model, read);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(got->cache.outcome, Outcome::kHit) << got->cache.reason;
  EXPECT_TRUE(BitwiseEqual(got->logits, want->logits));
}

TEST(CompileCacheTest, TableFuzzNeverCrashes) {
  // Every single-byte change of the table, with its checksum recomputed (as a buggy writer would
  // produce), is either rejected with a reason or gives a model that runs; never a crash.
  TempDir tmp;
  const fs::path model = kFixtures / "llama_f32";
  Opts write;
  write.quant = "int4";
  write.cache_dir = tmp.path().string();
  write.write = CompileCacheOptions::Write::kAlways;
  auto written = Load(model, write);
  ASSERT_TRUE(written.ok() && written->cache.outcome == Outcome::kWritten);
  const fs::path path = written->cache.path;
  const std::vector<uint8_t> good = ReadBytes(path);
  const uint64_t table = GetU64(good, kTableOffsetAt), table_bytes = GetU64(good, kTableBytesAt);
  Opts read = write;
  read.write = CompileCacheOptions::Write::kNever;
  std::mt19937 rng(7);
  int rejected = 0, used = 0;
  for (int i = 0; i < 300; ++i) {
    std::vector<uint8_t> bad = good;
    const uint64_t at = table + rng() % table_bytes;
    bad[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
    FixTableHash(bad);
    WriteBytes(path, bad);
    auto got = Load(model, read);
    ASSERT_TRUE(got.ok()) << "byte " << at - table << ": " << got.status().message();
    if (got->cache.outcome == Outcome::kHit) {
      ++used;
    } else {
      ASSERT_EQ(got->cache.outcome, Outcome::kNotUsed);
      ++rejected;
    }
  }
  std::printf("table fuzz: %d rejected, %d used\n", rejected, used);
  EXPECT_GT(rejected, 0);
}

TEST(CompileCacheTest, ConcurrentWritersLeaveOneCompleteFile) {
  TempDir tmp;
  const fs::path model = kFixtures / "ds_moe";
  auto want = Load(model, Opts{});
  ASSERT_TRUE(want.ok()) << want.status().message();
  Opts write;
  write.cache_dir = tmp.path().string();
  write.write = CompileCacheOptions::Write::kAlways;
  write.force = true;
  std::vector<std::thread> threads;
  std::atomic<int> written{0}, failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 3; ++i) {
        auto got = Load(model, write);
        if (!got.ok() || !BitwiseEqual(got->logits, want->logits)) ++failures;
        if (got.ok() && got->cache.outcome == Outcome::kWritten) ++written;
      }
    });
  }
  // A reader meanwhile: every load it does is a hit on a complete file or a plain load.
  threads.emplace_back([&] {
    Opts read = write;
    read.write = CompileCacheOptions::Write::kNever;
    read.force = false;
    for (int i = 0; i < 6; ++i) {
      auto got = Load(model, read);
      if (!got.ok() || !BitwiseEqual(got->logits, want->logits)) ++failures;
      if (got.ok() && got->cache.outcome == Outcome::kNotUsed) ++failures;  // torn file
    }
  });
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(written.load(), 12);
  const fs::path file = OnlyCacheFile(tmp.path());
  int entries = 0;
  for (const auto& e : fs::directory_iterator(tmp.path())) {
    ++entries;
    (void)e;
  }
  EXPECT_EQ(entries, 1) << "temporary files left behind";
  LoadOptions lo;
  auto key = CompileCacheKey(model.string(), lo, "cpu", "");
  ASSERT_TRUE(key.ok());
  auto checked = CheckCompileCacheFile(file.string(), "");
  EXPECT_TRUE(checked.ok()) << checked.status().message();
}

TEST(CompileCacheTest, UnwritableDirectoryStillLoads) {
  TempDir tmp;
  const fs::path blocker = tmp.path() / "not_a_dir";
  std::ofstream(blocker) << "x";
  Opts write;
  write.cache_dir = (blocker / "cache").string();
  write.write = CompileCacheOptions::Write::kAlways;
  auto got = Load(kFixtures / "llama_f32", write);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(got->cache.outcome, Outcome::kWriteFailed);
  EXPECT_FALSE(got->cache.reason.empty());
}

TEST(CompileCacheTest, KeyNamesItsInputs) {
  LoadOptions o;
  o.plan = *ParseWeightPlan({.quant = "int4"});
  auto key = CompileCacheKey((kFixtures / "qwen2_sharded").string(), o, "cpu", "target=AVX3");
  ASSERT_TRUE(key.ok()) << key.status().message();
  for (const char* part : {"format=4\n", "build=", "backend=cpu", "kernels=target=AVX3",
                           "\nweights=dtype=auto;embed=auto,attn=int4,", ",lm_head=auto,",
                           "config.json size=", "model.safetensors.index.json size=",
                           "-of-", "mtime_ns=", "header_xxh3="}) {
    EXPECT_NE(key->find(part), std::string::npos) << part << " in\n" << *key;
  }
  EXPECT_FALSE(CompileCacheKey((kFixtures / "no_such_model").string(), o, "cpu", "").ok());
}

TEST(CompileCacheTest, KeyIsTheParsedPlanNotTheFlagText) {
  // Two spellings of one set of weights share a key and a file; any other plan does not.
  const std::string model = (kFixtures / "qwen2_sharded").string();
  LoadOptions a, b, c;
  a.plan = *ParseWeightPlan({.dtype = "bf16", .quant = "int4"});
  b.plan = *ParseWeightPlan(
      {.dtype = "bfloat16", .policy = "custom:default=int4-g32,lm_head=stored"});
  c.plan = *ParseWeightPlan({.dtype = "bfloat16", .quant = "int4", .quant_lm_head = true});
  auto ka = CompileCacheKey(model, a, "cpu", ""), kb = CompileCacheKey(model, b, "cpu", ""),
       kc = CompileCacheKey(model, c, "cpu", "");
  ASSERT_TRUE(ka.ok() && kb.ok() && kc.ok());
  EXPECT_EQ(*ka, *kb);
  EXPECT_EQ(CompileCachePath("/c", model, a, "cpu"), CompileCachePath("/c", model, b, "cpu"));
  EXPECT_NE(*ka, *kc);
  EXPECT_NE(CompileCachePath("/c", model, a, "cpu"), CompileCachePath("/c", model, c, "cpu"));
  // The MLA mode does not change the weights, so it stays out of the key.
  b.plan.mla_mode = MlaMode::kAbsorbed;
  EXPECT_EQ(*ka, *CompileCacheKey(model, b, "cpu", ""));
}

}  // namespace
}  // namespace dh
