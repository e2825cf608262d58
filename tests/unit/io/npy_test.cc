// .npy: byte-exact header layout (NumPy 1.0, 64-byte aligned data), round trips, and refusal of
// malformed files.
#include "io/npy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/mapped_file.h"
#include "unit/io/io_test_util.h"

namespace dh {
namespace {

using ::testing::HasSubstr;

std::string ReadAllBytes(const std::string& path) {
  auto r = ReadTextFile(path);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? *r : std::string();
}

TEST(NpyTest, WritesNumpyHeader) {
  testing::TempDir dir;
  const float data[6] = {1, 2, 3, 4, 5, 6};
  const int64_t shape[2] = {2, 3};
  ASSERT_TRUE(WriteNpy(dir.File("a.npy"), DType::kF32, data, shape).ok());
  std::string bytes = ReadAllBytes(dir.File("a.npy"));
  ASSERT_EQ(bytes.size(), 128u + 24u);  // as numpy.save writes it
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8), 118);
  std::string header = bytes.substr(10, 118);
  EXPECT_EQ(header.rfind("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 0), 0u)
      << header;
  EXPECT_EQ(header.back(), '\n');

  const int64_t one_d[1] = {5};
  const int32_t ints[5] = {1, 2, 3, 4, 5};
  ASSERT_TRUE(WriteNpy(dir.File("b.npy"), DType::kI32, ints, one_d).ok());
  EXPECT_THAT(ReadAllBytes(dir.File("b.npy")), HasSubstr("'descr': '<i4'"));
  EXPECT_THAT(ReadAllBytes(dir.File("b.npy")), HasSubstr("'shape': (5,), }"));
}

TEST(NpyTest, RoundTrips) {
  testing::TempDir dir;
  const int64_t data[4] = {-1, 0, int64_t{1} << 40, 7};
  const int64_t shape[3] = {2, 1, 2};
  ASSERT_TRUE(WriteNpy(dir.File("c.npy"), DType::kI64, data, shape).ok());
  auto r = ReadNpy(dir.File("c.npy"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->dtype, DType::kI64);
  EXPECT_EQ(r->shape, (std::vector<int64_t>{2, 1, 2}));
  ASSERT_EQ(r->bytes.size(), 32u);
  EXPECT_EQ(r->as<int64_t>()[2], int64_t{1} << 40);

  const float scalar = 2.5f;
  ASSERT_TRUE(WriteNpy(dir.File("s.npy"), DType::kF32, &scalar, {}).ok());
  r = ReadNpy(dir.File("s.npy"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->shape.empty());
  EXPECT_EQ(r->as<float>()[0], 2.5f);
}

TEST(NpyTest, RefusesUnsupportedDType) {
  testing::TempDir dir;
  const uint16_t h = 0;
  const int64_t shape[1] = {1};
  EXPECT_FALSE(WriteNpy(dir.File("h.npy"), DType::kBF16, &h, shape).ok());
}

TEST(NpyTest, RefusesMalformedFiles) {
  testing::TempDir dir;
  auto header = [](const std::string& dict) {
    std::string h = dict + "\n";
    std::string out = std::string("\x93NUMPY\x01\x00", 8);
    out += static_cast<char>(h.size() & 0xff);
    out += static_cast<char>(h.size() >> 8);
    return out + h;
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"no magic", "hello world, not numpy"},
      {"short data",
       header("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }") + std::string(8, '\0')},
      {"fortran",
       header("{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }") + std::string(4, '\0')},
      {"big endian",
       header("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }") + std::string(4, '\0')},
      {"bad shape", header("{'descr': '<f4', 'fortran_order': False, 'shape': (a,), }")},
      {"missing key", header("{'descr': '<f4', 'shape': (1,), }") + std::string(4, '\0')},
      {"huge shape", header("{'descr': '<f4', 'fortran_order': False, 'shape': (999999999999999, "
                            "999999999999999), }")},
  };
  for (const auto& [name, bytes] : cases) {
    SCOPED_TRACE(name);
    testing::WriteFile(dir.File("bad.npy"), bytes);
    auto r = ReadNpy(dir.File("bad.npy"));
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.status().message(), HasSubstr("bad.npy"));
  }
}

}  // namespace
}  // namespace dh
