// MappedFile and ReadTextFile: contents, empty files, --no-mmap and --mlock paths, and refusal of
// missing files, directories, FIFOs and oversized text files.
#include "base/mapped_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

namespace dh {
namespace {

using ::testing::HasSubstr;

class MappedFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = ::testing::TempDir() + "dh_base_XXXXXX";
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    dir_ = templ;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& bytes) {
    std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  std::string dir_;
};

TEST_F(MappedFileTest, ReadsContentsEveryWay) {
  std::string bytes(10000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 31 + 7);
  const std::string path = Write("data.bin", bytes);
  for (bool use_mmap : {true, false}) {
    for (bool mlock : {false, true}) {
      auto r = MappedFile::Open(path, {.use_mmap = use_mmap, .mlock = mlock});
      ASSERT_TRUE(r.ok()) << r.status().message();
      EXPECT_EQ((*r)->path(), path);
      ASSERT_EQ((*r)->size(), bytes.size());
      EXPECT_EQ(std::memcmp((*r)->data(), bytes.data(), bytes.size()), 0);
    }
  }
}

TEST_F(MappedFileTest, EmptyFileIsFine) {
  const std::string path = Write("empty.bin", "");
  for (bool use_mmap : {true, false}) {
    auto r = MappedFile::Open(path, {.use_mmap = use_mmap});
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ((*r)->size(), 0u);
  }
  auto t = ReadTextFile(path);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, "");
}

TEST_F(MappedFileTest, RefusesMissingFilesDirectoriesAndFifos) {
  auto missing = MappedFile::Open(dir_ + "/nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("nope"));

  auto d = MappedFile::Open(dir_);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), HasSubstr("regular file"));

  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto f = MappedFile::Open(fifo);  // must not block waiting for a writer
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr("regular file"));
  EXPECT_FALSE(ReadTextFile(fifo).ok());
}

TEST_F(MappedFileTest, ReadTextFileHonoursLimit) {
  const std::string path = Write("config.json", "{\"a\": 1}");
  auto ok = ReadTextFile(path);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, "{\"a\": 1}");
  auto big = ReadTextFile(path, 4);
  ASSERT_FALSE(big.ok());
  EXPECT_THAT(big.status().message(), HasSubstr("config.json"));
}

}  // namespace
}  // namespace dh
