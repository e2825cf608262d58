// base/utf8: sequence lengths at the edges of RFC 3629 / Unicode Table 3-7, the two replacement
// policies on Unicode's own example (Table 3-8), code point round trips, and incomplete tails.
#include "base/utf8.h"

#include <gtest/gtest.h>

#include <string>

namespace dh {
namespace {

constexpr std::string_view kFffd = "\xEF\xBF\xBD";

std::string Fffd(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += kFffd;
  return s;
}

TEST(Utf8Test, SequenceLengthAcceptsEachWidthAndRefusesIllFormed) {
  EXPECT_EQ(Utf8SequenceLength("a", 0), 1u);
  EXPECT_EQ(Utf8SequenceLength("\xC3\xA9", 0), 2u);          // U+00E9
  EXPECT_EQ(Utf8SequenceLength("\xE2\x82\xAC", 0), 3u);      // U+20AC
  EXPECT_EQ(Utf8SequenceLength("\xF0\x9F\x98\x80", 0), 4u);  // U+1F600
  EXPECT_EQ(Utf8SequenceLength("x\xC3\xA9", 1), 2u);         // at an offset
  for (std::string_view bad : {
           std::string_view("\x80", 1),                // lone continuation byte
           std::string_view("\xC0\x80", 2),            // overlong NUL
           std::string_view("\xC1\xBF", 2),            // overlong
           std::string_view("\xE0\x80\x80", 3),        // overlong 3-byte
           std::string_view("\xED\xA0\x80", 3),        // surrogate U+D800
           std::string_view("\xF0\x80\x80\x80", 4),    // overlong 4-byte
           std::string_view("\xF4\x90\x80\x80", 4),    // U+110000
           std::string_view("\xF5\x80\x80\x80", 4),    // lead byte never used
           std::string_view("\xE2\x82", 2),            // truncated
           std::string_view("\xE2\x28\xA1", 3),        // bad continuation
       }) {
    EXPECT_EQ(Utf8SequenceLength(bad, 0), 0u) << testing::PrintToString(std::string(bad));
  }
  // The largest values of each width are accepted.
  EXPECT_EQ(Utf8SequenceLength("\xDF\xBF", 0), 2u);          // U+07FF
  EXPECT_EQ(Utf8SequenceLength("\xED\x9F\xBF", 0), 3u);      // U+D7FF, below the surrogates
  EXPECT_EQ(Utf8SequenceLength("\xEF\xBF\xBF", 0), 3u);      // U+FFFF
  EXPECT_EQ(Utf8SequenceLength("\xF4\x8F\xBF\xBF", 0), 4u);  // U+10FFFF
}

TEST(Utf8Test, ValidateNamesTheFirstBadByte) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain \xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("ab\xFF"));
  EXPECT_TRUE(ValidateUtf8("ok").ok());
  const Status s = ValidateUtf8("abc\xC3\xA9\xC3(");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "invalid UTF-8 at byte offset 5 (byte 0xC3)");
}

TEST(Utf8Test, CodePointsRoundTrip) {
  const char32_t cps[] = {0x0,    0x41,   0x7F,    0x80,    0x7FF,   0x800,
                          0xD7FF, 0xE000, 0xFFFD, 0xFFFF, 0x10000, 0x10FFFF};
  std::string all;
  for (char32_t cp : cps) {
    std::string one;
    AppendUtf8(cp, &one);
    const size_t want_len = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    EXPECT_EQ(one.size(), want_len) << static_cast<uint32_t>(cp);
    EXPECT_TRUE(IsValidUtf8(one)) << static_cast<uint32_t>(cp);
    all += one;
  }
  size_t pos = 0;
  for (char32_t cp : cps) {
    ASSERT_LT(pos, all.size());
    EXPECT_EQ(NextCodePoint(all, &pos), cp);
  }
  EXPECT_EQ(pos, all.size());
}

TEST(Utf8Test, LossyReplacesMaximalSubparts) {
  // Unicode 15, Table 3-8: "a F1 80 80 E1 80 C2 b 80 c 80 BF d" gives
  // a FFFD FFFD FFFD b FFFD c FFFD FFFD d (one U+FFFD per maximal subpart).
  const std::string in = "a\xF1\x80\x80\xE1\x80\xC2" "b\x80" "c\x80\xBF" "d";
  EXPECT_EQ(Utf8Lossy(in), "a" + Fffd(3) + "b" + Fffd(1) + "c" + Fffd(2) + "d");
  // ... and one U+FFFD per bad byte with the other policy.
  EXPECT_EQ(Utf8ReplaceEachBadByte(in), "a" + Fffd(6) + "b" + Fffd(1) + "c" + Fffd(2) + "d");
  // Valid text passes through both unchanged.
  const std::string ok = "h\xC3\xA9llo \xF0\x9F\x98\x80";
  EXPECT_EQ(Utf8Lossy(ok), ok);
  EXPECT_EQ(Utf8ReplaceEachBadByte(ok), ok);
  // A bad byte never swallows the valid character after it.
  EXPECT_EQ(Utf8Lossy("\xE2\x82\xC3\xA9"), Fffd(1) + "\xC3\xA9");
  EXPECT_EQ(Utf8ReplaceEachBadByte("\xE2\x82\xC3\xA9"), Fffd(2) + "\xC3\xA9");
}

TEST(Utf8Test, IncompleteTailIsAProperPrefixOfAValidSequence) {
  EXPECT_FALSE(EndsWithIncompleteUtf8(""));
  EXPECT_FALSE(EndsWithIncompleteUtf8("abc"));
  EXPECT_TRUE(EndsWithIncompleteUtf8("a\xE2"));
  EXPECT_TRUE(EndsWithIncompleteUtf8("a\xE2\x82"));
  EXPECT_FALSE(EndsWithIncompleteUtf8("a\xE2\x82\xAC"));
  EXPECT_TRUE(EndsWithIncompleteUtf8("\xF0\x9F\x98"));
  EXPECT_FALSE(EndsWithIncompleteUtf8("a\x80"));      // stray continuation: bad, not pending
  EXPECT_FALSE(EndsWithIncompleteUtf8("a\xFF"));      // never a lead byte
  EXPECT_FALSE(EndsWithIncompleteUtf8("\xED\xA0"));   // a surrogate will never complete
}

}  // namespace
}  // namespace dh
