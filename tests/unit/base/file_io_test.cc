// base/file_io: UniqueFd ownership, whole-range pread/pwrite (offsets, a file that ends early,
// a multi-MiB transfer) and OpenRegularFile's refusals.
#include "base/file_io.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <vector>

namespace dh {
namespace {

using ::testing::HasSubstr;

bool IsOpen(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

class FileIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = ::testing::TempDir() + "dh_file_io_XXXXXX";
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    dir_ = templ;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  std::string dir_;
};

TEST_F(FileIoTest, UniqueFdClosesOnResetAndScopeExitButNotAfterRelease) {
  const std::string p = Path("f");
  std::ofstream(p) << "x";
  int raw = -1;
  {
    UniqueFd fd(::open(p.c_str(), O_RDONLY));
    ASSERT_TRUE(fd.valid());
    raw = fd.get();
  }
  EXPECT_FALSE(IsOpen(raw));

  UniqueFd a(::open(p.c_str(), O_RDONLY));
  const int first = a.get();
  a.Reset(::open(p.c_str(), O_RDONLY));
  EXPECT_FALSE(IsOpen(first));
  EXPECT_TRUE(IsOpen(a.get()));
  const int kept = a.Release();
  EXPECT_FALSE(a.valid());
  a.Reset();
  EXPECT_TRUE(IsOpen(kept));
  ::close(kept);
}

TEST_F(FileIoTest, PwriteThenPreadAtOffsets) {
  const std::string p = Path("data");
  UniqueFd fd(::open(p.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600));
  ASSERT_TRUE(fd.valid());
  std::vector<uint8_t> bytes(3 << 20);  // several MiB: more than one transfer on most kernels
  std::iota(bytes.begin(), bytes.end(), uint8_t{7});
  ASSERT_TRUE(PwriteAll(fd.get(), bytes.data(), bytes.size(), 100, p).ok());
  struct stat st;
  ASSERT_EQ(::fstat(fd.get(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), bytes.size() + 100);

  std::vector<uint8_t> back(bytes.size());
  ASSERT_TRUE(PreadAll(fd.get(), back.data(), back.size(), 100, p).ok());
  EXPECT_EQ(back, bytes);
  uint8_t mid[4];
  ASSERT_TRUE(PreadAll(fd.get(), mid, 4, 100 + 1000, p).ok());
  EXPECT_EQ(mid[0], bytes[1000]);
  EXPECT_EQ(mid[3], bytes[1003]);
  // The gap before the offset reads as zeros.
  uint8_t head[100];
  ASSERT_TRUE(PreadAll(fd.get(), head, 100, 0, p).ok());
  EXPECT_EQ(std::count(head, head + 100, 0), 100);
}

TEST_F(FileIoTest, PreadPastTheEndNamesTheFileAndTheByte) {
  const std::string p = Path("short");
  std::ofstream(p) << "0123456789";
  UniqueFd fd(::open(p.c_str(), O_RDONLY));
  char buf[16];
  const Status s = PreadAll(fd.get(), buf, 8, 6, p);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_THAT(s.message(), HasSubstr(p + ": file ended at byte 10"));
  // A write to a read-only descriptor fails with the errno text.
  const Status w = PwriteAll(fd.get(), buf, 4, 0, p);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.message(), HasSubstr(p + ": "));
  EXPECT_THAT(w.message(), HasSubstr(ErrnoText(EBADF)));
}

TEST_F(FileIoTest, OpenRegularFileGivesSizeAndRefusesOthers) {
  const std::string p = Path("regular");
  std::ofstream(p) << "hello";
  uint64_t size = 0;
  auto fd = OpenRegularFile(p, &size);
  ASSERT_TRUE(fd.ok()) << fd.status().message();
  UniqueFd owned(*fd);
  EXPECT_EQ(size, 5u);

  auto missing = OpenRegularFile(Path("none"), &size);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(Path("none")));

  auto dir = OpenRegularFile(dir_, &size);
  ASSERT_FALSE(dir.ok());
  EXPECT_THAT(dir.status().message(), HasSubstr("expected a regular file, got a directory"));

  // A FIFO with no writer: refused at once instead of blocking in open().
  const std::string fifo = Path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto f = OpenRegularFile(fifo, &size);
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr("a special file"));
}

TEST(FileIoErrnoTest, ErrnoTextIsStrerror) {
  EXPECT_EQ(ErrnoText(ENOENT), std::string(std::strerror(ENOENT)));
  EXPECT_FALSE(ErrnoText(EACCES).empty());
}

}  // namespace
}  // namespace dh
