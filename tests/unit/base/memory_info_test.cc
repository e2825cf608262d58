// Resident memory (base/memory_info.h): smaps_rollup's fields parsed from text, and this
// process's own read back.
#include "base/memory_info.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace dh {
namespace {

TEST(ResidentMemoryTest, ParsesRssAnonymousAndHugePagesInBytes) {
  const std::string text =
      "5581e6a0c000-7ffd3e1f8000 ---p 00000000 00:00 0                          [rollup]\n"
      "Rss:            19267328 kB\n"
      "Pss:            19263521 kB\n"
      "Anonymous:      18874368 kB\n"
      "LazyFree:              0 kB\n"
      "AnonHugePages:  17956864 kB\n"
      "ShmemPmdMapped:        0 kB\n";
  const auto r = ParseSmapsRollup(text);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->rss, uint64_t{19267328} * 1024);
  EXPECT_EQ(r->anonymous, uint64_t{18874368} * 1024);
  EXPECT_EQ(r->anon_huge, uint64_t{17956864} * 1024);
}

TEST(ResidentMemoryTest, MissingFieldsAreZeroAndNoRssIsNothing) {
  const auto r = ParseSmapsRollup("Rss: 2048 kB\n");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->rss, 2048u * 1024);
  EXPECT_EQ(r->anonymous, 0u);
  EXPECT_EQ(r->anon_huge, 0u);
  EXPECT_FALSE(ParseSmapsRollup("").has_value());
  EXPECT_FALSE(ParseSmapsRollup("Pss: 10 kB\nAnonHugePages: 0 kB\n").has_value());
}

TEST(ResidentMemoryTest, MalformedLinesAreSkipped) {
  // A unit other than kB, a missing number, a value that would overflow in bytes.
  const auto r = ParseSmapsRollup(
      "Rss: 12 MB\nRss: x kB\nAnonymous: 99999999999999999999 kB\nAnonymous: 18446744073709551615 "
      "kB\nRss: 8 kB\nAnonHugePages:\n");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->rss, 8u * 1024);
  EXPECT_EQ(r->anonymous, 0u);
  EXPECT_EQ(r->anon_huge, 0u);
}

#if defined(__linux__)
TEST(ResidentMemoryTest, ThisProcessHasResidentMemory) {
  const auto r = ReadResidentMemory();
  ASSERT_TRUE(r.has_value());
  EXPECT_GT(r->rss, 0u);
  EXPECT_LE(r->anon_huge, r->anonymous);
}
#endif

}  // namespace
}  // namespace dh
