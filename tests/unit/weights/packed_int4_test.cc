// AWQ / GPTQ int4 -> kInt4 conversion (weights/packed_int4): the tests pack random codes, zero
// points and f16 scales into each checkpoint layout, convert, and check that
//  - the codes, f16 scales and zero points are the stored ones (GPTQ v1: zero offset 1),
//  - every dequantized value (q - z) * scale equals (q - z) * s computed in double, bit for bit
//    (no second rounding), including the extremes z = 16 (GPTQ v1), the largest f16 scale and
//    subnormal f16 scales, and bf16 scales (exact in f16's normal range, counted below it),
//  - act-order g_idx gives a permutation whose product (reference backend) matches the dense
//    dequantized matrix,
//  - malformed tensors give one-line errors naming the file, tensor and value.
#include "weights/packed_int4.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>

#include "backend/reference/reference_backend.h"

namespace dh {
namespace {

using ::testing::HasSubstr;

constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

// A projection quantized in a test: codes q[r][k], zero points z[r][g], f16 scales s[r][g],
// group assignment g_idx[k].
struct Quantized {
  int64_t rows, cols, group;
  std::vector<int> q, z, g_idx;
  std::vector<uint16_t> s;
  int Group(int64_t k) const { return g_idx[k]; }
  int64_t groups() const { return cols / group; }
  // (q - z) * s in double, as the checkpoint defines the value.
  double Value(int64_t r, int64_t k) const {
    const int64_t g = r * groups() + Group(k);
    return static_cast<double>(q[r * cols + k] - z[g]) * F16ToF32(s[g]);
  }
};

Quantized Random(int64_t rows, int64_t cols, int64_t group, uint32_t seed, bool act_order,
                 int zmin = 0, int zmax = 15) {
  std::mt19937 gen(seed);
  Quantized m{rows, cols, group, {}, {}, {}, {}};
  std::uniform_int_distribution<int> code(0, 15), zero(zmin, zmax);
  std::uniform_real_distribution<float> scale(1e-3f, 0.05f);
  for (int64_t i = 0; i < rows * cols; ++i) m.q.push_back(code(gen));
  for (int64_t i = 0; i < rows * m.groups(); ++i) {
    m.z.push_back(zero(gen));
    m.s.push_back(F32ToF16(scale(gen)));
  }
  for (int64_t k = 0; k < cols; ++k) m.g_idx.push_back(static_cast<int>(k / group));
  if (act_order) std::shuffle(m.g_idx.begin(), m.g_idx.end(), gen);
  return m;
}

// Owns tensor bytes and their TensorInfo records.
struct Checkpoint {
  std::map<std::string, std::vector<uint8_t>> bytes;
  std::map<std::string, TensorInfo> infos;
  template <typename T>
  TensorInfo* Add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                  const std::vector<T>& values) {
    auto& b = bytes[name];
    b.resize(values.size() * sizeof(T));
    std::memcpy(b.data(), values.data(), b.size());
    TensorInfo& t = infos[name];
    t.name = name;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.data = b.data();
    t.nbytes = b.size();
    t.file = "/ckpt/model.safetensors";
    return &t;
  }
};

// Packs m in the AWQ GEMM layout.
PackedInt4Tensors PackAwq(const Quantized& m, Checkpoint& ck) {
  const int64_t words = m.rows / 8;
  std::vector<int32_t> qw(m.cols * words, 0), qz(m.groups() * words, 0);
  std::vector<uint16_t> sc(m.groups() * m.rows);
  for (int64_t k = 0; k < m.cols; ++k) {
    for (int64_t j = 0; j < words; ++j) {
      uint32_t w = 0;
      for (int i = 0; i < 8; ++i) w |= uint32_t(m.q[(8 * j + kAwqOrder[i]) * m.cols + k]) << (4 * i);
      qw[k * words + j] = static_cast<int32_t>(w);
    }
  }
  for (int64_t g = 0; g < m.groups(); ++g) {
    for (int64_t j = 0; j < words; ++j) {
      uint32_t w = 0;
      for (int i = 0; i < 8; ++i) {
        w |= uint32_t(m.z[(8 * j + kAwqOrder[i]) * m.groups() + g]) << (4 * i);
      }
      qz[g * words + j] = static_cast<int32_t>(w);
    }
    for (int64_t r = 0; r < m.rows; ++r) sc[g * m.rows + r] = m.s[r * m.groups() + g];
  }
  PackedInt4Tensors t;
  t.qweight = ck.Add("p.qweight", DType::kI32, {m.cols, words}, qw);
  t.qzeros = ck.Add("p.qzeros", DType::kI32, {m.groups(), words}, qz);
  t.scales = ck.Add("p.scales", DType::kF16, {m.groups(), m.rows}, sc);
  return t;
}

// Packs m in the GPTQ layout; v1 stores zero - 1.
PackedInt4Tensors PackGptq(const Quantized& m, Checkpoint& ck, bool v1, bool with_g_idx = true) {
  const int64_t words = m.rows / 8;
  std::vector<int32_t> qw((m.cols / 8) * m.rows, 0), qz(m.groups() * words, 0);
  std::vector<uint16_t> sc(m.groups() * m.rows);
  for (int64_t p = 0; p < m.cols / 8; ++p) {
    for (int64_t r = 0; r < m.rows; ++r) {
      uint32_t w = 0;
      for (int i = 0; i < 8; ++i) w |= uint32_t(m.q[r * m.cols + 8 * p + i]) << (4 * i);
      qw[p * m.rows + r] = static_cast<int32_t>(w);
    }
  }
  for (int64_t g = 0; g < m.groups(); ++g) {
    for (int64_t j = 0; j < words; ++j) {
      uint32_t w = 0;
      for (int i = 0; i < 8; ++i) {
        const int z = m.z[(8 * j + i) * m.groups() + g] - (v1 ? 1 : 0);
        w |= uint32_t(z & 15) << (4 * i);
      }
      qz[g * words + j] = static_cast<int32_t>(w);
    }
    for (int64_t r = 0; r < m.rows; ++r) sc[g * m.rows + r] = m.s[r * m.groups() + g];
  }
  PackedInt4Tensors t;
  t.qweight = ck.Add("p.qweight", DType::kI32, {m.cols / 8, m.rows}, qw);
  t.qzeros = ck.Add("p.qzeros", DType::kI32, {m.groups(), words}, qz);
  t.scales = ck.Add("p.scales", DType::kF16, {m.groups(), m.rows}, sc);
  if (with_g_idx) t.g_idx = ck.Add("p.g_idx", DType::kI32, {m.cols}, m.g_idx);
  return t;
}

QuantizationConfig Config(const std::string& method, int group, const std::string& fmt = "gptq") {
  QuantizationConfig q;
  q.method = method;
  q.bits = 4;
  q.group_size = group;
  q.checkpoint_format = fmt;
  return q;
}

// Every dequantized value equals (q - z) * s exactly, and the stored parts are the inputs.
void ExpectExact(const Quantized& m, Int4Host& h) {
  ASSERT_EQ(h.rows, m.rows);
  ASSERT_EQ(h.cols, m.cols);
  ASSERT_EQ(h.group_size, m.group);
  const std::vector<float> deq = h.Dequantize();
  int bad = 0;
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t k = 0; k < m.cols; ++k) {
      const double want = m.Value(r, k);
      ASSERT_EQ(static_cast<double>(static_cast<float>(want)), want) << "not representable";
      if (deq[r * m.cols + k] != static_cast<float>(want) && ++bad < 5) {
        ADD_FAILURE() << "value [" << r << ", " << k << "] " << deq[r * m.cols + k] << " != " << want;
      }
    }
  }
  EXPECT_EQ(bad, 0);
  // Stored parts: scale = s (f16 bits), zero nibble + offset = z, codes = q (in our column
  // order).
  const int64_t zero_bytes = (m.groups() + 1) / 2;
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t g = 0; g < m.groups(); ++g) {
      EXPECT_EQ(h.scales[r * m.groups() + g], m.s[r * m.groups() + g]);
      EXPECT_EQ(ZeroNibble(h.zeros.data() + r * zero_bytes, g) + h.zero_offset,
                m.z[r * m.groups() + g]);
    }
    for (int64_t c = 0; c < m.cols; ++c) {
      const int64_t k = h.perm.empty() ? c : h.perm[c];
      const uint8_t b = h.codes[r * (m.cols / 2) + c / 2];
      ASSERT_EQ((c & 1) ? b >> 4 : b & 15, m.q[r * m.cols + k]);
      ASSERT_EQ(m.Group(k), c / m.group) << "group columns must be contiguous";
    }
  }
}

TEST(PackedInt4Test, AwqIsExact) {
  const Quantized m = Random(24, 256, 128, 1, false);
  Checkpoint ck;
  auto t = PackAwq(m, ck);
  auto h = ConvertPackedInt4(Config("awq", 128), t, m.rows, m.cols);
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_TRUE(h->perm.empty());
  ExpectExact(m, *h);
}

TEST(PackedInt4Test, AwqPerRowGroup) {
  const Quantized m = Random(8, 64, 64, 2, false);
  Checkpoint ck;
  auto h = ConvertPackedInt4(Config("awq", -1), PackAwq(m, ck), m.rows, m.cols);
  ASSERT_TRUE(h.ok()) << h.status().message();
  ExpectExact(m, *h);
}

TEST(PackedInt4Test, GptqV1V2AndSymmetric) {
  for (const char* fmt : {"gptq", "gptq_v2"}) {
    SCOPED_TRACE(fmt);
    const bool v1 = std::string(fmt) == "gptq";
    // v1 stores zero - 1, so its zero points are 1..16.
    const Quantized m = Random(16, 256, 128, 3, false, v1 ? 1 : 0, v1 ? 16 : 15);
    Checkpoint ck;
    auto h = ConvertPackedInt4(Config("gptq", 128, fmt), PackGptq(m, ck, v1), m.rows, m.cols);
    ASSERT_TRUE(h.ok()) << h.status().message();
    EXPECT_TRUE(h->perm.empty());
    ExpectExact(m, *h);
    // Symmetric: every zero point 8 (stored as 7 in v1).
    Quantized sym = m;
    std::fill(sym.z.begin(), sym.z.end(), 8);
    Checkpoint ck2;
    auto hs = ConvertPackedInt4(Config("gptq", 128, fmt), PackGptq(sym, ck2, v1), m.rows, m.cols);
    ASSERT_TRUE(hs.ok()) << hs.status().message();
    ExpectExact(sym, *hs);
  }
}

TEST(PackedInt4Test, GptqWithoutGIdx) {
  const Quantized m = Random(8, 128, 32, 4, false);
  Checkpoint ck;
  auto h = ConvertPackedInt4(Config("gptq", 32, "gptq_v2"), PackGptq(m, ck, false, false), m.rows,
                             m.cols);
  ASSERT_TRUE(h.ok()) << h.status().message();
  ExpectExact(m, *h);
}

TEST(PackedInt4Test, ExtremeScalesAndZerosStayExact) {
  Quantized m = Random(8, 128, 32, 5, false, 1, 16);
  // Largest normal f16, smallest subnormal f16, a subnormal with all bits set, and odd mantissas.
  const uint16_t special[] = {0x7bff, 0x0001, 0x03ff, 0x3fff, 0x0400, 0x7801, 0x0000, 0x8bff};
  for (size_t i = 0; i < m.s.size(); ++i) m.s[i] = special[i % 8];
  for (size_t i = 0; i < m.z.size(); ++i) m.z[i] = i % 2 ? 16 : 1;
  for (size_t i = 0; i < m.q.size(); ++i) m.q[i] = i % 3 ? 0 : 15;
  Checkpoint ck;
  auto h = ConvertPackedInt4(Config("gptq", 32), PackGptq(m, ck, true), m.rows, m.cols);
  ASSERT_TRUE(h.ok()) << h.status().message();
  ExpectExact(m, *h);
}

// bf16 scales: converted to f16 exactly in f16's normal range; a scale below it is rounded and
// counted.
TEST(PackedInt4Test, Bf16ScalesConvertExactlyInF16Range) {
  Quantized m = Random(16, 128, 32, 8, false);
  for (uint16_t& h : m.s) h = F32ToF16(BF16ToF32(F32ToBF16(F16ToF32(h))));  // bf16 precision
  Checkpoint ck;
  auto t = PackAwq(m, ck);
  auto& bytes = ck.bytes["p.scales"];
  ck.infos["p.scales"].dtype = DType::kBF16;
  auto* sc = reinterpret_cast<uint16_t*>(bytes.data());
  for (size_t i = 0; i < bytes.size() / 2; ++i) sc[i] = F32ToBF16(F16ToF32(sc[i]));
  auto h = ConvertPackedInt4(Config("awq", 32), t, m.rows, m.cols);
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(h->inexact_scales, 0);
  ExpectExact(m, *h);
  sc[0] = F32ToBF16(1.1e-7f);  // below f16's normal range: 8 significant bits do not fit
  auto rounded = ConvertPackedInt4(Config("awq", 32), t, m.rows, m.cols);
  ASSERT_TRUE(rounded.ok()) << rounded.status().message();
  EXPECT_EQ(rounded->inexact_scales, 1);
}

TEST(PackedInt4Test, ActOrderPermutesAndMultipliesCorrectly) {
  const Quantized m = Random(16, 384, 128, 6, /*act_order=*/true, 1, 15);
  Checkpoint ck;
  auto h = ConvertPackedInt4(Config("gptq", 128), PackGptq(m, ck, true), m.rows, m.cols);
  ASSERT_TRUE(h.ok()) << h.status().message();
  ASSERT_EQ(h->perm.size(), 384u);
  ExpectExact(m, *h);
  // perm is stable: within a group, input columns stay in increasing order.
  for (int64_t c = 1; c < m.cols; ++c) {
    if (c % m.group != 0) EXPECT_LT(h->perm[c - 1], h->perm[c]);
  }
  // The permuted weight times x equals the dense dequantized weight times x.
  ReferenceBackend ref{BackendOptions{}};
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(3 * m.cols), got(3 * m.rows), want(3 * m.rows);
  for (float& v : x) v = u(gen);
  std::vector<float> dense = h->Dequantize();
  Tensor xt(x.data(), DType::kF32, {3, m.cols});
  ref.MatMul(xt, h->View(), Tensor(), Tensor(got.data(), DType::kF32, {3, m.rows}));
  ref.MatMul(xt, Weight::Dense(Tensor(dense.data(), DType::kF32, {m.rows, m.cols})), Tensor(),
             Tensor(want.data(), DType::kF32, {3, m.rows}));
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5f) << i;
}

TEST(PackedInt4Test, ActOrderPermutationChecksGroups) {
  std::vector<int32_t> g = {1, 0, 0, 1};
  auto p = ActOrderPermutation(g, 2, 2, "t");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, (std::vector<int32_t>{1, 2, 0, 3}));
  auto id = ActOrderPermutation(std::vector<int32_t>{0, 0, 1, 1}, 2, 2, "t");
  ASSERT_TRUE(id.ok());
  EXPECT_TRUE(id->empty());
  auto bad = ActOrderPermutation(std::vector<int32_t>{0, 0, 0, 1}, 2, 2, "t");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("group 0 has 3 input columns"));
  auto range = ActOrderPermutation(std::vector<int32_t>{0, 2, 1, 1}, 2, 2, "t");
  ASSERT_FALSE(range.ok());
  EXPECT_THAT(range.status().message(), HasSubstr("g_idx[1] = 2"));
}

struct Bad {
  const char* name;
  std::function<void(Checkpoint&, PackedInt4Tensors&, QuantizationConfig&, int64_t&)> edit;
  std::vector<std::string> expected;
};

TEST(PackedInt4Test, BadInputsGiveClearErrors) {
  const Quantized m = Random(16, 256, 128, 8, false);
  const std::vector<Bad> cases = {
      {"awq qweight shape",
       [](Checkpoint&, PackedInt4Tensors& t, QuantizationConfig& q, int64_t&) {
         q = Config("awq", 128);
         auto* info = const_cast<TensorInfo*>(t.qweight);
         info->shape = {32, 256};  // GPTQ's layout under an AWQ config
       },
       {"/ckpt/model.safetensors: tensor 'p.qweight' has shape [32, 256]", "expected [256, 2]",
        "AWQ qweight"}},
      {"gptq qweight shape",
       [](Checkpoint&, PackedInt4Tensors& t, QuantizationConfig&, int64_t&) {
         const_cast<TensorInfo*>(t.qweight)->shape = {256, 2};
       },
       {"tensor 'p.qweight' has shape [256, 2], expected [32, 16]"}},
      {"qzeros shape",
       [](Checkpoint&, PackedInt4Tensors& t, QuantizationConfig&, int64_t&) {
         const_cast<TensorInfo*>(t.qzeros)->shape = {4, 2};
       },
       {"tensor 'p.qzeros' has shape [4, 2], expected [2, 2]", "group_size 128"}},
      {"scales shape",
       [](Checkpoint&, PackedInt4Tensors& t, QuantizationConfig&, int64_t&) {
         const_cast<TensorInfo*>(t.scales)->shape = {16, 2};
       },
       {"tensor 'p.scales' has shape [16, 2], expected [2, 16]"}},
      {"scales dtype",
       [](Checkpoint&, PackedInt4Tensors& t, QuantizationConfig&, int64_t&) {
         const_cast<TensorInfo*>(t.scales)->dtype = DType::kF32;
       },
       {"tensor 'p.scales' has dtype F32, expected F16 or BF16"}},
      {"qzeros dtype",
       [](Checkpoint&, PackedInt4Tensors& t, QuantizationConfig&, int64_t&) {
         const_cast<TensorInfo*>(t.qzeros)->dtype = DType::kF16;
       },
       {"tensor 'p.qzeros' has dtype F16, expected I32"}},
      {"g_idx out of range",
       [](Checkpoint& ck, PackedInt4Tensors& t, QuantizationConfig&, int64_t&) {
         std::vector<int32_t> g(256, 0);
         g[7] = 5;
         t.g_idx = ck.Add("p.g_idx", DType::kI32, {256}, g);
       },
       {"tensor 'p.g_idx': g_idx[7] = 5 is outside [0, 2)"}},
      {"g_idx inconsistent groups",
       [](Checkpoint& ck, PackedInt4Tensors& t, QuantizationConfig&, int64_t&) {
         std::vector<int32_t> g(256, 0);
         for (int i = 0; i < 100; ++i) g[i] = 1;
         t.g_idx = ck.Add("p.g_idx", DType::kI32, {256}, g);
       },
       {"tensor 'p.g_idx': group 0 has 156 input columns in g_idx, expected 128"}},
      {"g_idx shape",
       [](Checkpoint& ck, PackedInt4Tensors& t, QuantizationConfig&, int64_t&) {
         t.g_idx = ck.Add("p.g_idx", DType::kI32, {128}, std::vector<int32_t>(128, 0));
       },
       {"tensor 'p.g_idx' has shape [128], expected [256]"}},
      {"desc_act without g_idx",
       [](Checkpoint&, PackedInt4Tensors& t, QuantizationConfig& q, int64_t&) {
         q.desc_act = true;
         t.g_idx = nullptr;
       },
       {"desc_act is true but 'p.g_idx' is missing"}},
      {"bits 8",
       [](Checkpoint&, PackedInt4Tensors&, QuantizationConfig& q, int64_t&) { q.bits = 8; },
       {"tensor 'p.qweight'", "bits 8 is not supported (expected 4)"}},
      {"not divisible by group",
       [](Checkpoint&, PackedInt4Tensors&, QuantizationConfig& q, int64_t&) {
         q.group_size = 96;
       },
       {"in_features 256 is not divisible by quantization_config.group_size 96"}},
      {"in_features not divisible by 8",
       [](Checkpoint&, PackedInt4Tensors&, QuantizationConfig& q, int64_t& cols) {
         q.group_size = -1;
         cols = 252;
       },
       {"16 x 252 projection", "divisible by 8"}},
      {"unknown method",
       [](Checkpoint&, PackedInt4Tensors&, QuantizationConfig& q, int64_t&) { q.method = "fp8"; },
       {"quant_method is 'fp8' (expected awq or gptq)"}},
      {"missing qzeros",
       [](Checkpoint&, PackedInt4Tensors& t, QuantizationConfig&, int64_t&) { t.qzeros = nullptr; },
       {"tensor 'p.qweight' has no companion 'p.qzeros'"}},
      {"infinite scale",
       [](Checkpoint&, PackedInt4Tensors& t, QuantizationConfig&, int64_t&) {
         uint16_t inf = 0x7c00;
         std::memcpy(const_cast<uint8_t*>(t.scales->data) + 2 * 17, &inf, 2);
       },
       {"tensor 'p.scales': scale inf at [1, 1]"}},
  };
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.name);
    Checkpoint ck;
    PackedInt4Tensors t = PackGptq(m, ck, true);
    QuantizationConfig q = Config("gptq", 128);
    int64_t cols = m.cols;
    c.edit(ck, t, q, cols);
    auto r = ConvertPackedInt4(q, t, m.rows, cols);
    ASSERT_FALSE(r.ok());
    const std::string msg = r.status().message();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const auto& e : c.expected) EXPECT_THAT(msg, HasSubstr(e));
  }
}

}  // namespace
}  // namespace dh
