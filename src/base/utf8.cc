// UTF-8 validation, iteration and replacement (utf8.h).
#include "base/utf8.h"

#include <cstdint>

namespace dh {
namespace {

// What a lead byte promises: the sequence length (0: not a lead byte) and the range its second
// byte must fall in (Unicode Table 3-7; later bytes are plain continuations 80..BF).
struct Lead {
  size_t len = 0;
  uint8_t lo = 0x80, hi = 0xBF;
};

Lead LeadOf(uint8_t c) {
  Lead l;
  if (c >= 0xC2 && c <= 0xDF) {
    l.len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    l.len = 3;
    if (c == 0xE0) l.lo = 0xA0;
    if (c == 0xED) l.hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    l.len = 4;
    if (c == 0xF0) l.lo = 0x90;
    if (c == 0xF4) l.hi = 0x8F;
  }
  return l;
}

// How many bytes of s[pos..] (at least 1) match the start of a well-formed sequence: the whole
// sequence when it is valid, else the "maximal subpart" that one U+FFFD replaces.
size_t MatchingPrefix(std::string_view s, size_t pos, const Lead& l) {
  size_t i = 1;
  for (; i < l.len && pos + i < s.size(); ++i) {
    const uint8_t x = static_cast<uint8_t>(s[pos + i]);
    const bool ok = i == 1 ? (x >= l.lo && x <= l.hi) : (x & 0xC0) == 0x80;
    if (!ok) break;
  }
  return i;
}

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

}  // namespace

size_t Utf8SequenceLength(std::string_view s, size_t pos) {
  const uint8_t c = static_cast<uint8_t>(s[pos]);
  if (c < 0x80) return 1;
  const Lead l = LeadOf(c);
  if (l.len == 0) return 0;
  return MatchingPrefix(s, pos, l) == l.len ? l.len : 0;
}

bool IsValidUtf8(std::string_view s) {
  for (size_t pos = 0; pos < s.size();) {
    const size_t len = Utf8SequenceLength(s, pos);
    if (len == 0) return false;
    pos += len;
  }
  return true;
}

Status ValidateUtf8(std::string_view s) {
  for (size_t pos = 0; pos < s.size();) {
    const size_t len = Utf8SequenceLength(s, pos);
    if (len == 0) {
      return InvalidArgument("invalid UTF-8 at byte offset {} (byte 0x{:02X})", pos,
                             static_cast<uint8_t>(s[pos]));
    }
    pos += len;
  }
  return Status::Ok();
}

char32_t NextCodePoint(std::string_view s, size_t* pos) {
  const auto b = [&](size_t i) { return static_cast<char32_t>(static_cast<uint8_t>(s[i])); };
  const size_t p = *pos;
  const char32_t c = b(p);
  if (c < 0x80) {
    *pos = p + 1;
    return c;
  }
  if (c < 0xE0) {
    *pos = p + 2;
    return ((c & 0x1F) << 6) | (b(p + 1) & 0x3F);
  }
  if (c < 0xF0) {
    *pos = p + 3;
    return ((c & 0x0F) << 12) | ((b(p + 1) & 0x3F) << 6) | (b(p + 2) & 0x3F);
  }
  *pos = p + 4;
  return ((c & 0x07) << 18) | ((b(p + 1) & 0x3F) << 12) | ((b(p + 2) & 0x3F) << 6) |
         (b(p + 3) & 0x3F);
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t pos = 0; pos < bytes.size();) {
    const size_t len = Utf8SequenceLength(bytes, pos);
    if (len > 0) {
      out.append(bytes.substr(pos, len));
      pos += len;
    } else {
      out.append(kReplacement);
      const Lead l = LeadOf(static_cast<uint8_t>(bytes[pos]));
      pos += l.len == 0 ? 1 : MatchingPrefix(bytes, pos, l);
    }
  }
  return out;
}

std::string Utf8ReplaceEachBadByte(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t pos = 0; pos < bytes.size();) {
    const size_t len = Utf8SequenceLength(bytes, pos);
    if (len == 0) {
      out.append(kReplacement);
      ++pos;
    } else {
      out.append(bytes.substr(pos, len));
      pos += len;
    }
  }
  return out;
}

bool EndsWithIncompleteUtf8(std::string_view s) {
  // Look back at most 3 bytes for a lead byte whose sequence runs past the end.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t pos = n - back;
    const uint8_t c = static_cast<uint8_t>(s[pos]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    const Lead l = LeadOf(c);
    if (l.len == 0) return false;
    return back < l.len && MatchingPrefix(s, pos, l) == back;
  }
  return false;
}

}  // namespace dh
