// UTF-8 helpers shared by the tokenizer stages: validation (naming the first bad byte), code point
// iteration, lossy decoding like Rust's String::from_utf8_lossy, and the GPT-2 byte<->char table.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace dh::tok {

// Length of the well-formed UTF-8 sequence starting at s[pos], or 0 if it is not well formed
// (overlong, surrogate, truncated, > U+10FFFF).
size_t ValidSequenceLength(std::string_view s, size_t pos);

// OK when `s` is well-formed UTF-8; otherwise InvalidArgument naming the first bad byte offset.
Status ValidateUtf8(std::string_view s);

// Decodes the code point at s[*pos] (which must be valid UTF-8) and advances *pos.
char32_t NextCodePoint(std::string_view s, size_t* pos);

void AppendUtf8(char32_t cp, std::string* out);

// Replaces each maximal invalid subpart with U+FFFD (the Unicode "substitution of maximal
// subparts" policy, as Rust's from_utf8_lossy does).
std::string Utf8Lossy(std::string_view bytes);

// True when `s` ends with a UTF-8 sequence that is a proper prefix of a valid sequence.
bool EndsWithIncompleteUtf8(std::string_view s);

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
