// UTF-8 validation/lossy decoding and the GPT-2 byte-level table (see utf8.h).
#include "tokenizer/utf8.h"

#include <utf8proc.h>

namespace dh::tok {

size_t ValidSequenceLength(std::string_view s, size_t pos) {
  const auto b = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const size_t n = s.size();
  const uint8_t c = b(pos);
  if (c < 0x80) return 1;
  size_t len;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (pos + 1 >= n || b(pos + 1) < lo || b(pos + 1) > hi) return 0;
  for (size_t i = 2; i < len; ++i) {
    if (pos + i >= n || (b(pos + i) & 0xC0) != 0x80) return 0;
  }
  return len;
}

Status ValidateUtf8(std::string_view s) {
  for (size_t pos = 0; pos < s.size();) {
    const size_t len = ValidSequenceLength(s, pos);
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
  size_t p = *pos;
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

namespace {
// Length of the longest prefix of s[pos..] that could begin a valid sequence (at least 1): the
// "maximal subpart" replaced by a single U+FFFD.
size_t MaximalInvalidSubpart(std::string_view s, size_t pos) {
  const uint8_t c = static_cast<uint8_t>(s[pos]);
  size_t len;
  uint8_t lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 1;
  }
  size_t i = 1;
  for (; i < len && pos + i < s.size(); ++i) {
    const uint8_t x = static_cast<uint8_t>(s[pos + i]);
    const bool ok = i == 1 ? (x >= lo && x <= hi) : (x & 0xC0) == 0x80;
    if (!ok) break;
  }
  return i;
}
}  // namespace

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t pos = 0; pos < bytes.size();) {
    const size_t len = ValidSequenceLength(bytes, pos);
    if (len > 0) {
      out.append(bytes.substr(pos, len));
      pos += len;
    } else {
      out.append("\xEF\xBF\xBD");
      pos += MaximalInvalidSubpart(bytes, pos);
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
    if (c < 0xC2 || c > 0xF4) return false;
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    return back < need && MaximalInvalidSubpart(s, pos) == back;
  }
  return false;
}

const ByteLevelTable& GetByteLevelTable() {
  static const ByteLevelTable table = [] {
    ByteLevelTable t;
    t.char_to_byte.fill(-1);
    const auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = printable(b) ? static_cast<char32_t>(b) : 256 + extra++;
      AppendUtf8(cp, &t.byte_to_utf8[b]);
      t.char_to_byte[cp] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return table;
}

bool IsWhitespace(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool IsPunctuation(char32_t cp) {
  if (cp < 0x80) {
    return (cp >= '!' && cp <= '/') || (cp >= ':' && cp <= '@') || (cp >= '[' && cp <= '`') ||
           (cp >= '{' && cp <= '~');
  }
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
}

bool IsNumeric(char32_t cp) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

bool IsAlphanumeric(char32_t cp) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) || IsNumeric(cp);
}

}  // namespace dh::tok
