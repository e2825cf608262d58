// UTF-8 in one place (tokenizer, chat template lexer, server JSON output): well-formedness per
// RFC 3629 / Unicode Table 3-7 (no overlongs, surrogates or code points past U+10FFFF), code point
// iteration and encoding, and the two ways of replacing bad bytes with U+FFFD.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "base/status.h"

namespace dh {

// Length of the well-formed UTF-8 sequence starting at s[pos], or 0 if it is not well formed
// (overlong, surrogate, truncated, > U+10FFFF).
size_t Utf8SequenceLength(std::string_view s, size_t pos);

// Whether all of `s` is well-formed UTF-8.
bool IsValidUtf8(std::string_view s);
// OK when `s` is well-formed UTF-8; otherwise InvalidArgument naming the first bad byte offset.
Status ValidateUtf8(std::string_view s);

// Decodes the code point at s[*pos] (which must be valid UTF-8) and advances *pos.
char32_t NextCodePoint(std::string_view s, size_t* pos);
// Appends the UTF-8 encoding of `cp` (<= U+10FFFF).
void AppendUtf8(char32_t cp, std::string* out);

// Replaces each maximal invalid subpart with one U+FFFD (the Unicode "substitution of maximal
// subparts" policy, as Rust's String::from_utf8_lossy does).
std::string Utf8Lossy(std::string_view bytes);
// Replaces every byte that does not start a well-formed sequence with its own U+FFFD (what the
// server's JSON writer does, so that one bad byte never swallows the next character).
std::string Utf8ReplaceEachBadByte(std::string_view bytes);

// True when `s` ends with a UTF-8 sequence that is a proper prefix of a valid sequence.
bool EndsWithIncompleteUtf8(std::string_view s);

}  // namespace dh
