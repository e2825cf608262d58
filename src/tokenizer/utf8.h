// Tokenizer text helpers: the GPT-2 byte<->char table and Unicode categories (utf8proc), over
// the UTF-8 primitives of base/utf8.h.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"
#include "base/utf8.h"

namespace dh::tok {

// The UTF-8 primitives live in base/utf8.h; the tokenizer stages name them as tok:: too.
using ::dh::AppendUtf8;
using ::dh::EndsWithIncompleteUtf8;
using ::dh::NextCodePoint;
using ::dh::Utf8Lossy;
using ::dh::ValidateUtf8;
inline size_t ValidSequenceLength(std::string_view s, size_t pos) {
  return Utf8SequenceLength(s, pos);
}

// GPT-2's reversible byte -> printable character mapping used by the ByteLevel stages.
struct ByteLevelTable {
  std::array<std::string, 256> byte_to_utf8;  // each entry is one code point
  std::array<int16_t, 324> char_to_byte;      // code point (all < 324) -> byte, -1 if none
};
const ByteLevelTable& GetByteLevelTable();

// Unicode general-category helpers (via utf8proc).
bool IsWhitespace(char32_t cp);   // Rust char::is_whitespace (White_Space property)
bool IsPunctuation(char32_t cp);  // ASCII punctuation or a P* category
bool IsNumeric(char32_t cp);      // Nd, Nl or No
bool IsAlphanumeric(char32_t cp);

}  // namespace dh::tok
