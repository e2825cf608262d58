// deepharness verify: copies of golden fixtures broken in one way each; every break must be
// reported under the right check and name the tensor or file at fault, and clean copies must
// pass (including a sha256 manifest written here).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "backend/reference/reference_backend.h"
#include "base/sha256.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "tensor/dtype.h"
#include "tools/verify.h"

namespace dh {
namespace {

namespace fs = std::filesystem;

fs::path Golden(const std::string& name) {
  return fs::path(DH_SOURCE_DIR) / "tests/golden/fixtures" / name;
}

class VerifyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_ = fs::temp_directory_path() /
           ("dh_verify_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(tmp_);
    fs::create_directories(tmp_);
  }
  void TearDown() override { fs::remove_all(tmp_); }

  // Copies a fixture directory; returns the copy.
  fs::path Copy(const std::string& name) {
    const fs::path dst = tmp_ / name;
    fs::copy(Golden(name), dst, fs::copy_options::recursive);
    return dst;
  }

  // Rewrites `file` in place: edit(name, bytes, shape) may change bytes/shape; returning false
  // drops the tensor. `extra` tensors are appended.
  using Edit = std::function<bool(const std::string&, std::vector<uint8_t>&, std::vector<int64_t>&)>;
  void Rewrite(const fs::path& file, const Edit& edit,
               std::vector<std::tuple<std::string, DType, std::vector<int64_t>>> extra = {}) {
    std::vector<std::pair<std::string, std::vector<uint8_t>>> bytes;
    std::vector<std::pair<DType, std::vector<int64_t>>> meta;
    {
      auto st = SafetensorsFile::Open(file.string());
      ASSERT_TRUE(st.ok()) << st.status().message();
      for (const TensorInfo& t : (*st)->tensors()) {
        std::vector<uint8_t> b(t.data, t.data + t.nbytes);
        std::vector<int64_t> shape = t.shape;
        if (!edit(t.name, b, shape)) continue;
        bytes.push_back({t.name, std::move(b)});
        meta.push_back({t.dtype, shape});
      }
    }
    for (auto& [name, dtype, shape] : extra) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      bytes.push_back({name, std::vector<uint8_t>(n * DTypeSize(dtype), 1)});
      meta.push_back({dtype, shape});
    }
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (size_t i = 0; i < bytes.size(); ++i) {
      tensors.push_back({bytes[i].first,
                         Tensor::FromDims(bytes[i].second.data(), meta[i].first, meta[i].second)});
    }
    fs::remove(file);
    Status s = WriteSafetensors(file.string(), tensors);
    ASSERT_TRUE(s.ok()) << s.message();
  }

  VerifyReport Verify(const fs::path& dir, const std::string& manifest = "") {
    VerifyOptions o;
    o.model_path = dir.string();
    o.manifest = manifest;
    o.threads = 2;
    o.progress = false;
    ReferenceBackend backend{BackendOptions{}};
    auto r = VerifyCheckpoint(o, &backend);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : VerifyReport{};
  }

  static std::string Problems(const VerifyReport& r) {
    std::string s;
    for (const VerifyProblem& p : r.problems) s += p.check + " | " + p.where + " | " + p.message + "\n";
    return s;
  }
  static bool Has(const VerifyReport& r, const std::string& check, const std::string& where,
                  const std::string& text = "") {
    for (const VerifyProblem& p : r.problems) {
      if (p.check == check && p.where.find(where) != std::string::npos &&
          p.message.find(text) != std::string::npos) {
        return true;
      }
    }
    return false;
  }

  // A copy of llama_f32 with an extra 2304 x 1024 f32 tensor (9 MiB: two read chunks of whole
  // rows) holding a NaN in the second chunk, an all-zero row in the first and, with `inf`, an
  // Inf in the first.
  fs::path CopyWithBigTensor(const std::string& big, bool inf) {
    const fs::path d = Copy("llama_f32");
    Rewrite(d / "model.safetensors",
            [](const std::string&, std::vector<uint8_t>&, std::vector<int64_t>&) { return true; },
            {{big, DType::kF32, {2304, 1024}}});
    Rewrite(d / "model.safetensors", [&](const std::string& name, std::vector<uint8_t>& b,
                                          std::vector<int64_t>&) {
      if (name != big) return true;
      const float nan = std::nanf(""), infinity = INFINITY;
      std::memcpy(b.data() + 4 * (2200 * 1024 + 3), &nan, 4);
      if (inf) std::memcpy(b.data() + 4 * (7 * 1024 + 5), &infinity, 4);
      std::memset(b.data() + 4 * 100 * 1024, 0, 4 * 1024);
      return true;
    });
    return d;
  }

  fs::path tmp_;
};

std::string Manifest(const fs::path& dir, const std::vector<std::string>& files) {
  std::string out;
  for (const std::string& f : files) {
    std::ifstream in(dir / f, std::ios::binary);
    std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    out += Sha256::Hex(data) + "  " + f + "\n";
  }
  return out;
}

TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(Sha256::Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256::Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // 56 bytes: the padding spills into a second block.
  EXPECT_EQ(Sha256::Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 h;  // fed in odd pieces
  const std::string m(1000, 'a');
  for (size_t i = 0; i < m.size(); i += 7) h.Update(m.data() + i, std::min<size_t>(7, m.size() - i));
  EXPECT_EQ(h.HexDigest(), Sha256::Hex(m));
}

TEST_F(VerifyTest, CleanCheckpointsPass) {
  for (const char* name : {"ds_v3_fp8", "qwen2_gptq", "qwen2_sharded", "llama_f32"}) {
    const VerifyReport r = Verify(Copy(name));
    EXPECT_TRUE(r.clean()) << name << ":\n" << Problems(r);
    EXPECT_GT(r.tensors, 0);
  }
}

TEST_F(VerifyTest, ManifestMatchesAndMismatches) {
  const fs::path d = Copy("ds_v3_fp8");
  {
    std::ofstream(tmp_ / "good.sha256") << Manifest(d, {"config.json", "model.safetensors"});
  }
  VerifyReport r = Verify(d, (tmp_ / "good.sha256").string());
  EXPECT_TRUE(r.clean()) << Problems(r);
  EXPECT_GT(r.hashed_bytes, 0u);
  // One flipped byte in the data region.
  {
    std::fstream f(d / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x55');
  }
  r = Verify(d, (tmp_ / "good.sha256").string());
  EXPECT_TRUE(Has(r, "sha256", "model.safetensors", "manifest says")) << Problems(r);
  EXPECT_FALSE(Has(r, "sha256", "config.json")) << Problems(r);
  // A manifest that leaves a shard out, and lists a missing file.
  { std::ofstream(tmp_ / "partial.sha256") << Manifest(d, {"config.json"}) << std::string(64, '0') + "  gone.safetensors\n"; }
  r = Verify(d, (tmp_ / "partial.sha256").string());
  EXPECT_TRUE(Has(r, "sha256", "model.safetensors", "not in the manifest")) << Problems(r);
  EXPECT_TRUE(Has(r, "sha256", "gone.safetensors", "missing")) << Problems(r);
  // A malformed manifest means verify could not run.
  { std::ofstream(tmp_ / "bad.sha256") << "not a manifest\n"; }
  VerifyOptions o;
  o.model_path = d.string();
  o.manifest = (tmp_ / "bad.sha256").string();
  o.progress = false;
  EXPECT_FALSE(VerifyCheckpoint(o, nullptr).ok());
  o.manifest = "";
  o.model_path = (tmp_ / "no_such_dir").string();
  EXPECT_FALSE(VerifyCheckpoint(o, nullptr).ok());
}

TEST_F(VerifyTest, NanInfAbsurdAndZeroRowsAreNamed) {
  const fs::path d = Copy("llama_f32");
  std::string victim_nan, victim_zero, victim_big;
  Rewrite(d / "model.safetensors", [&](const std::string& name, std::vector<uint8_t>& b,
                                        std::vector<int64_t>& shape) {
    if (shape.size() != 2 || name.find("embed") != std::string::npos) return true;
    float v;
    if (victim_nan.empty()) {
      victim_nan = name;
      v = std::nanf("");
      std::memcpy(b.data() + 4 * 5, &v, 4);
      v = INFINITY;
      std::memcpy(b.data() + 4 * 6, &v, 4);
    } else if (victim_zero.empty()) {
      victim_zero = name;
      std::memset(b.data() + 4 * shape[1], 0, 4 * shape[1]);  // row 1
    } else if (victim_big.empty()) {
      victim_big = name;
      v = 3e5f;
      std::memcpy(b.data(), &v, 4);
    }
    return true;
  });
  const VerifyReport r = Verify(d);
  EXPECT_TRUE(Has(r, "values", victim_nan, "1 NaN, 1 Inf")) << Problems(r);
  EXPECT_TRUE(Has(r, "values", victim_zero, "1 all-zero rows")) << Problems(r);
  EXPECT_TRUE(Has(r, "values", victim_big, "|x| > 10000")) << Problems(r);
  EXPECT_EQ(r.problems.size(), 3u) << Problems(r);
}

TEST_F(VerifyTest, Fp8ScalesWrongSignAndShape) {
  const fs::path d = Copy("ds_v3_fp8");
  Rewrite(d / "model.safetensors", [](const std::string& name, std::vector<uint8_t>& b,
                                      std::vector<int64_t>& shape) {
    if (name == "model.layers.0.mlp.down_proj.weight_scale_inv") {
      const float v = -1.0f;
      std::memcpy(b.data(), &v, 4);
    }
    if (name == "model.layers.0.mlp.gate_proj.weight_scale_inv") shape = {4, 1};
    return true;
  });
  const VerifyReport r = Verify(d);
  EXPECT_TRUE(Has(r, "fp8-scales", "down_proj.weight_scale_inv", "not finite and positive"))
      << Problems(r);
  EXPECT_TRUE(Has(r, "fp8-scales", "gate_proj.weight_scale_inv", "expected [2, 2]")) << Problems(r);
}

TEST_F(VerifyTest, MissingAndUnexpectedTensors) {
  const fs::path d = Copy("qwen2_sharded");
  const fs::path shard = d / "model-00001-of-00002.safetensors";
  std::string dropped;
  Rewrite(shard, [&](const std::string& name, std::vector<uint8_t>&, std::vector<int64_t>&) {
    if (dropped.empty() && name.find("post_attention_layernorm") != std::string::npos) {
      dropped = name;
      return false;
    }
    return true;
  });
  // The index still lists the dropped tensor: the checkpoint no longer opens.
  VerifyReport r = Verify(d);
  EXPECT_TRUE(Has(r, "structure", "", dropped)) << Problems(r);
  // Take it out of the index too: now the architecture's loader misses it.
  nlohmann::json index = nlohmann::json::parse(std::ifstream(d / "model.safetensors.index.json"));
  index["weight_map"].erase(dropped);
  std::ofstream(d / "model.safetensors.index.json") << index.dump();
  r = Verify(d);
  EXPECT_TRUE(Has(r, "tensors", dropped, "missing: expected [")) << Problems(r);
  // On a fresh copy: an extra tensor in a shard that the index does not list.
  const fs::path d2 = tmp_ / "extra";
  fs::copy(Golden("qwen2_sharded"), d2, fs::copy_options::recursive);
  Rewrite(d2 / "model-00001-of-00002.safetensors", [](const std::string&, std::vector<uint8_t>&, std::vector<int64_t>&) { return true; },
          {{"model.layers.0.mystery.weight", DType::kF32, {4, 4}}});
  r = Verify(d2);
  EXPECT_TRUE(Has(r, "structure", "model.layers.0.mystery.weight", "not in model.safetensors.index.json"))
      << Problems(r);
  // The expected-tensor check names it too, as a tensor the architecture does not use.
  EXPECT_TRUE(Has(r, "tensors", "model.layers.0.mystery.weight", "unexpected tensor"))
      << Problems(r);
}

// A shard in the directory that the index does not list, and a manifest line for a file that is
// not there: both named.
TEST_F(VerifyTest, UnlistedShardAndMissingManifestFileAreNamed) {
  const fs::path d = Copy("qwen2_sharded");
  fs::copy_file(d / "model-00002-of-00002.safetensors", d / "model-stray.safetensors");
  std::ofstream(tmp_ / "m.sha256")
      << Manifest(d, {"config.json", "model.safetensors.index.json",
                      "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                      "model-stray.safetensors"})
      << std::string(64, '0') << "  gone.safetensors\n";
  const VerifyReport r = Verify(d, (tmp_ / "m.sha256").string());
  EXPECT_TRUE(Has(r, "structure", "model-stray.safetensors", "a shard the index does not list"))
      << Problems(r);
  EXPECT_TRUE(Has(r, "sha256", "gone.safetensors", "listed in the manifest but missing"))
      << Problems(r);
  EXPECT_FALSE(Has(r, "sha256", "model-00001-of-00002.safetensors")) << Problems(r);
}

TEST_F(VerifyTest, MtpLayerIsCheckedNotSkipped) {
  // ds_v3_mtp carries one multi-token-prediction layer (docs/mtp.md): clean as committed, its
  // tensors counted as used, and a wrong shape or a missing tensor in it named like a main layer's.
  VerifyReport r = Verify(Copy("ds_v3_mtp"));
  EXPECT_TRUE(r.clean()) << Problems(r);
  const fs::path d = tmp_ / "broken";
  fs::copy(Golden("ds_v3_mtp"), d, fs::copy_options::recursive);
  const nlohmann::json config = nlohmann::json::parse(std::ifstream(d / "config.json"));
  const std::string p = "model.layers." + std::to_string(config["num_hidden_layers"].get<int>()) + ".";
  bool reshaped = false, dropped = false;
  Rewrite(d / "model.safetensors",
          [&](const std::string& name, std::vector<uint8_t>&, std::vector<int64_t>& shape) {
            if (name == p + "eh_proj.weight") {
              std::swap(shape[0], shape[1]);
              reshaped = true;
            }
            if (name == p + "hnorm.weight") {
              dropped = true;
              return false;
            }
            return true;
          });
  ASSERT_TRUE(reshaped && dropped);
  r = Verify(d);
  EXPECT_TRUE(Has(r, "tensors", p + "eh_proj.weight", ", expected [")) << Problems(r);
  EXPECT_TRUE(Has(r, "tensors", p + "hnorm.weight", "missing: expected [")) << Problems(r);
  // A release without the MTP weights (config still counting the layer) is not flagged.
  const fs::path d2 = tmp_ / "dropped";
  fs::copy(Golden("ds_v3_mtp"), d2, fs::copy_options::recursive);
  Rewrite(d2 / "model.safetensors",
          [&](const std::string& name, std::vector<uint8_t>&, std::vector<int64_t>&) {
            return name.compare(0, p.size(), p) != 0;
          });
  r = Verify(d2);
  EXPECT_TRUE(r.clean()) << Problems(r);
}

TEST_F(VerifyTest, SingleFileMissingWrongShapeAndUnexpectedAreAllNamed) {
  const fs::path d = Copy("llama_f32");
  std::string dropped_a, dropped_b, reshaped;
  Rewrite(d / "model.safetensors",
          [&](const std::string& name, std::vector<uint8_t>&, std::vector<int64_t>& shape) {
            if (name == "model.layers.0.input_layernorm.weight") {
              dropped_a = name;
              return false;
            }
            if (name == "model.norm.weight") {
              dropped_b = name;
              return false;
            }
            if (name == "model.layers.0.self_attn.o_proj.weight") {
              reshaped = name;
              std::swap(shape[0], shape[1]);
              shape[0] = shape[0] * shape[1];
              shape[1] = 1;
            }
            return true;
          },
          {{"lm_head.extra_bias", DType::kF32, {8}}, {"model.layers.7.mlp.up_proj.weight", DType::kF32, {2, 2}}});
  ASSERT_FALSE(reshaped.empty());
  const VerifyReport r = Verify(d);
  // Every problem at once (loading the model would stop at the first).
  EXPECT_TRUE(Has(r, "tensors", dropped_a, "missing: expected [")) << Problems(r);
  EXPECT_TRUE(Has(r, "tensors", dropped_b, "missing: expected [")) << Problems(r);
  EXPECT_TRUE(Has(r, "tensors", reshaped, ", expected [")) << Problems(r);
  EXPECT_TRUE(Has(r, "tensors", "lm_head.extra_bias", "unexpected tensor")) << Problems(r);
  EXPECT_TRUE(Has(r, "tensors", "model.layers.7.mlp.up_proj.weight", "unexpected tensor"))
      << Problems(r);
  int tensor_problems = 0;
  for (const VerifyProblem& p : r.problems) tensor_problems += p.check == "tensors";
  EXPECT_EQ(tensor_problems, 5) << Problems(r);
}

TEST_F(VerifyTest, FindingsInTensorsLargerThanOneReadChunk) {
  // A 2304 x 1024 f32 tensor (9 MiB) is read in two chunks of whole rows; a NaN in the second
  // chunk and an all-zero row in the first must both be counted under its name.
  const std::string big = "model.layers.0.big.weight";
  const fs::path d = CopyWithBigTensor(big, /*inf=*/false);
  const VerifyReport r = Verify(d);
  EXPECT_TRUE(Has(r, "values", big, "1 NaN")) << Problems(r);
  EXPECT_TRUE(Has(r, "values", big, "1 all-zero rows")) << Problems(r);
  EXPECT_TRUE(Has(r, "tensors", big, "unexpected tensor")) << Problems(r);
  EXPECT_GE(r.stats_bytes, uint64_t{2304} * 1024 * 4);
}

// A chunk that is not in the page cache is read with pread instead of being counted where the
// checkpoint is mapped: the same findings, at the right places, whichever path a chunk took.
TEST_F(VerifyTest, FindingsInChunksReadFromDiskNotThePageCache) {
  const std::string big = "model.layers.0.big.weight";
  const fs::path d = CopyWithBigTensor(big, /*inf=*/true);
  // Written back and dropped from the page cache (clean pages: no root needed).
  const int fd = ::open((d / "model.safetensors").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fsync(fd), 0);
  ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  ::close(fd);
  const VerifyReport r = Verify(d);
  EXPECT_TRUE(Has(r, "values", big, "1 NaN, 1 Inf")) << Problems(r);
  EXPECT_TRUE(Has(r, "values", big, "1 all-zero rows")) << Problems(r);
  EXPECT_GE(r.stats_bytes, uint64_t{2304} * 1024 * 4);
}

// Tensors at file offsets off the 4 KiB grid, chunk and span boundaries inside rows, and a file
// that ends off the grid: the same findings, and none leaking into a neighbour, whichever way the
// bytes arrive — O_DIRECT (aligned reads around each span, the edges skipped), buffered pread, or
// in place on the mapping from the page cache.
TEST_F(VerifyTest, UnalignedTensorEdgesGiveTheSameFindingsOnEveryReadPath) {
  const fs::path d = Copy("llama_f32");
  const fs::path file = d / "model.safetensors";
  const std::string a = "model.layers.0.edge_a.weight", big = "model.layers.0.edge_big.weight",
                    c = "model.layers.0.edge_c.weight", last = "model.layers.0.edge_last.weight";
  const int64_t rows = 8200, cols = 1025;  // bf16 rows of 2050 bytes: 16.8 MB, three chunks
  Rewrite(file, [](const std::string&, std::vector<uint8_t>&, std::vector<int64_t>&) { return true; },
          {{a, DType::kF32, {7, 3}},
           {big, DType::kBF16, {rows, cols}},
           {c, DType::kF32, {3, 5}},
           {last, DType::kF16, {1, 3}}});
  Rewrite(file, [&](const std::string& name, std::vector<uint8_t>& b, std::vector<int64_t>&) {
    const uint16_t bf_nan = 0x7fc0, bf_inf = 0x7f80, bf_ninf = 0xff80;
    auto put16 = [&](int64_t i, uint16_t v) { std::memcpy(b.data() + 2 * i, &v, 2); };
    if (name == a) {  // its last element, right before the big tensor's first byte
      const float nan = std::nanf("");
      std::memcpy(b.data() + 4 * 20, &nan, 4);
    } else if (name == big) {
      put16(0, bf_inf);                             // the first element
      put16(4092 * cols - 1, bf_nan);               // the last one of the first 8 MiB chunk
      put16(4092 * cols, bf_ninf);                  // the first one of the second
      std::memset(b.data() + 2 * 4093 * cols, 0, 2 * cols);  // an all-zero row
      put16(rows * cols - 1, bf_nan);               // the last element
    } else if (name == last) {
      put16(2, 0x7800);  // f16 32768, the file's last two bytes
    }
    return true;
  });
  // Where the planted tensors lie in the file: off the 4 KiB grid, as the test intends.
  uint64_t big_at = 0;
  {
    auto st = SafetensorsFile::Open(file.string());
    ASSERT_TRUE(st.ok()) << st.status().message();
    const uint8_t* start = nullptr;
    for (const TensorInfo& t : (*st)->tensors())
      if (start == nullptr || t.data < start) start = t.data;
    std::ifstream in(file, std::ios::binary);
    uint64_t header_len = 0;
    in.read(reinterpret_cast<char*>(&header_len), 8);  // little-endian host
    for (const TensorInfo& t : (*st)->tensors())
      if (t.name == big) big_at = 8 + header_len + static_cast<uint64_t>(t.data - start);
  }
  ASSERT_NE(big_at % 4096, 0u);
  ASSERT_NE(fs::file_size(file) % 4096, 0u);
  auto drop = [&] {  // written back and dropped from the page cache (clean pages: no root)
    const int fd = ::open(file.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::fsync(fd), 0);
    ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    ::close(fd);
  };
  auto check = [&](const VerifyReport& r) {
    EXPECT_TRUE(Has(r, "values", a, "1 NaN")) << Problems(r);
    EXPECT_FALSE(Has(r, "values", a, "Inf")) << Problems(r);
    EXPECT_TRUE(Has(r, "values", big, "2 NaN, 2 Inf, 1 all-zero rows")) << Problems(r);
    EXPECT_FALSE(Has(r, "values", c)) << Problems(r);
    EXPECT_TRUE(Has(r, "values", last, "1 values with |x| > 10000 (max 32768)")) << Problems(r);
    EXPECT_EQ(r.stats_bytes_mapped + r.stats_bytes_direct + r.stats_bytes_buffered, r.stats_bytes);
    EXPECT_GE(r.stats_bytes, uint64_t{rows} * cols * 2);
  };
  auto run = [&](bool direct_io) {
    VerifyOptions o;
    o.model_path = d.string();
    o.threads = 2;
    o.progress = false;
    o.load_model = false;
    o.direct_io = direct_io;
    auto r = VerifyCheckpoint(o, nullptr);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : VerifyReport{};
  };
  // Whether this filesystem takes O_DIRECT (tmpfs before Linux 6.6 does not: buffered then).
  bool direct_ok = false;
  {
    const int fd = ::open(file.c_str(), O_RDONLY | O_DIRECT);
    void* p = std::aligned_alloc(4096, 4096);
    direct_ok = fd >= 0 && ::pread(fd, p, 4096, 0) == 4096;
    std::free(p);
    if (fd >= 0) ::close(fd);
  }
  drop();
  {
    SCOPED_TRACE("cold, O_DIRECT");
    const VerifyReport r = run(true);
    check(r);
    if (direct_ok) {
      EXPECT_GE(r.stats_bytes_direct, uint64_t{rows} * cols * 2);
    } else {
      EXPECT_EQ(r.stats_bytes_direct, 0u);
    }
  }
  drop();
  {
    SCOPED_TRACE("cold, buffered");
    const VerifyReport r = run(false);
    check(r);
    EXPECT_EQ(r.stats_bytes_direct, 0u);
    EXPECT_GE(r.stats_bytes_buffered, uint64_t{rows} * cols * 2);
  }
  {
    // Read through once, every span is in the page cache, but the kernel may still take a page
    // away (reclaim under another test's load, a huge-page collapse of the mapping) between the
    // read and the count: the tool then reads that span, as it should. So the file is read and
    // counted up to five times; the findings must hold every time and one run must count all of
    // it in place.
    SCOPED_TRACE("in the page cache");
    bool all_in_place = false;
    uint64_t mapped = 0, total = 0;
    for (int attempt = 0; attempt < 5 && !all_in_place; ++attempt) {
      std::ifstream in(file, std::ios::binary);
      std::vector<char> all(fs::file_size(file));
      ASSERT_TRUE(in.read(all.data(), static_cast<std::streamsize>(all.size())));
      const VerifyReport r = run(true);
      check(r);
      mapped = r.stats_bytes_mapped;
      total = r.stats_bytes;
      all_in_place = mapped == total;
    }
    EXPECT_TRUE(all_in_place) << "last of five runs counted " << mapped << " of " << total
                              << " bytes in place";
  }
}

// The value statistics work on raw bits (magnitude compares, no decode). Against a decode of
// every element: random bit patterns in every float format, with NaN, Inf, -0.0 rows, values at
// and just past the |x| limit, and subnormals, must give the same counts and max |x|.
TEST_F(VerifyTest, ValueStatisticsMatchADecodeOfEveryElementInEveryFormat) {
  const fs::path d = Copy("llama_f32");
  const int64_t rows = 8, cols = 96;
  const std::vector<DType> dtypes = {DType::kF64, DType::kF32, DType::kF16, DType::kBF16,
                                     DType::kF8E4M3, DType::kF8E5M2};
  auto name_of = [](DType t) { return "model.stats_" + std::string(DTypeName(t)) + ".weight"; };
  auto decode = [](DType t, const uint8_t* p) -> double {
    uint16_t h;
    switch (t) {
      case DType::kF64: { double v; std::memcpy(&v, p, 8); return v; }
      case DType::kF32: { float v; std::memcpy(&v, p, 4); return v; }
      case DType::kF16: std::memcpy(&h, p, 2); return F16ToF32(h);
      case DType::kBF16: std::memcpy(&h, p, 2); return BF16ToF32(h);
      case DType::kF8E4M3: return F8E4M3ToF32(*p);
      default: return F8E5M2ToF32(*p);
    }
  };
  std::vector<std::tuple<std::string, DType, std::vector<int64_t>>> extra;
  for (DType t : dtypes) extra.push_back({name_of(t), t, {rows, cols}});
  Rewrite(d / "model.safetensors",
          [](const std::string&, std::vector<uint8_t>&, std::vector<int64_t>&) { return true; },
          extra);
  struct Expect { uint64_t nan = 0, inf = 0, absurd = 0, zero_rows = 0; double max_abs = 0; };
  std::map<std::string, Expect> expect;
  uint64_t state = 0x9e3779b97f4a7c15u;
  auto next = [&] {  // xorshift64*
    state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
    return state * 0x2545f4914f6cdd1du;
  };
  Rewrite(d / "model.safetensors", [&](const std::string& name, std::vector<uint8_t>& b,
                                        std::vector<int64_t>&) {
    DType t = DType::kF32;
    bool ours = false;
    for (DType c : dtypes) if (name == name_of(c)) t = c, ours = true;
    if (!ours) return true;
    const size_t es = DTypeSize(t);
    for (size_t i = 0; i < b.size(); i += 8) {
      const uint64_t r = next();
      std::memcpy(b.data() + i, &r, std::min<size_t>(8, b.size() - i));
    }
    // Row 2 is -0.0 and +0.0 only; row 5 holds the limit exactly and the next value past it.
    for (int64_t c = 0; c < cols; ++c) {
      std::memset(b.data() + (2 * cols + c) * es, 0, es);
      if (c % 2) b[(2 * cols + c) * es + es - 1] = 0x80;  // little-endian sign bit
    }
    auto put = [&](int64_t at, double v) {
      uint8_t* p = b.data() + at * es;
      switch (t) {
        case DType::kF64: std::memcpy(p, &v, 8); break;
        case DType::kF32: { const float f = static_cast<float>(v); std::memcpy(p, &f, 4); break; }
        default: break;  // the narrow formats cannot hold 10000 exactly; random bits cover them
      }
    };
    put(5 * cols, 10000.0);
    put(5 * cols + 1, std::nextafter(10000.0f, 1e9f));
    Expect e;
    for (int64_t r = 0; r < rows; ++r) {
      bool zero = true;
      for (int64_t c = 0; c < cols; ++c) {
        const double v = decode(t, b.data() + (r * cols + c) * es);
        zero = zero && v == 0.0;
        if (std::isnan(v)) ++e.nan;
        else if (std::isinf(v)) ++e.inf;
        else {
          e.max_abs = std::max(e.max_abs, std::fabs(v));
          if (std::fabs(v) > 1e4) ++e.absurd;
        }
      }
      e.zero_rows += zero;
    }
    expect[name] = e;
    return true;
  });
  const VerifyReport r = Verify(d);
  ASSERT_EQ(expect.size(), dtypes.size());
  for (const auto& [name, e] : expect) {
    SCOPED_TRACE(name);
    const TensorStats* s = nullptr;
    for (const TensorStats& x : r.stats) if (x.name == name) s = &x;
    ASSERT_NE(s, nullptr) << Problems(r);
    EXPECT_EQ(s->nan, e.nan);
    EXPECT_EQ(s->inf, e.inf);
    EXPECT_EQ(s->absurd, e.absurd);
    EXPECT_EQ(s->zero_rows, e.zero_rows);
    EXPECT_EQ(s->max_abs, e.max_abs);
    EXPECT_GE(e.zero_rows, 1u);
  }
}

TEST_F(VerifyTest, GptqPackingAndTruncation) {
  const fs::path d = Copy("qwen2_gptq");
  Rewrite(d / "model.safetensors", [](const std::string& name, std::vector<uint8_t>& b,
                                      std::vector<int64_t>& shape) {
    if (name == "model.layers.0.self_attn.q_proj.qzeros") shape = {2, 8};  // same bytes, wrong grid
    if (name == "model.layers.0.mlp.up_proj.g_idx") {
      const int32_t v = 7;
      std::memcpy(b.data() + 4 * 3, &v, 4);
    }
    return true;
  });
  VerifyReport r = Verify(d);
  EXPECT_TRUE(Has(r, "packing", "self_attn.q_proj", "qzeros [2, 8]")) << Problems(r);
  EXPECT_TRUE(Has(r, "packing", "mlp.up_proj", "g_idx[3] = 7")) << Problems(r);
  // A truncated file: the structure check names it.
  const fs::path f = Copy("llama_f32") / "model.safetensors";
  fs::resize_file(f, fs::file_size(f) - 100);
  r = Verify(f.parent_path());
  EXPECT_TRUE(Has(r, "structure", "", "model.safetensors")) << Problems(r);
}

}  // namespace
}  // namespace dh
