// Jinja lexer. Follows jinja2/lexer.py: newlines normalized to \n, one trailing newline dropped,
// `{%-`/`-%}` strip all whitespace on that side, lstrip_blocks only when the tag starts its line.
#include "chat/jinja_lexer.h"

#include <algorithm>
#include <cstring>

#include "base/utf8.h"

namespace dh::chat::jinja {
namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  Lexer(std::string source, const LexOptions& options) : s_(std::move(source)), opt_(options) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < s_.size(); ++i) {
      if (s_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  Result<std::vector<Token>> Run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < s_.size()) {
      size_t i = FindTagStart(pos);
      std::string text = s_.substr(pos, (i == std::string::npos ? s_.size() : i) - pos);
      if (i == std::string::npos) {
        Emit(TokenKind::kText, std::move(text), pos);
        break;
      }
      char kind = s_[i + 1];
      char sign = (i + 2 < s_.size() && (s_[i + 2] == '-' || s_[i + 2] == '+')) ? s_[i + 2] : 0;
      if (sign == '-') {
        size_t end = text.size();
        while (end > 0 && IsSpace(text[end - 1])) --end;
        text.resize(end);
      } else if (sign != '+' && opt_.lstrip_blocks && kind != '{') {
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
            std::all_of(text.begin() + l_pos, text.end(),
                        [](char c) { return c != '\n' && IsSpace(c); })) {
          text.resize(l_pos);
        }
      }
      Emit(TokenKind::kText, std::move(text), pos);
      size_t p = i + 2 + (sign ? 1 : 0);
      size_t end;
      if (kind == '#') {
        size_t close = s_.find("#}", p);
        if (close == std::string::npos) return Error(i, "unterminated comment, expected '#}'");
        end = close + 2;
        char end_sign = close > p ? s_[close - 1] : 0;
        end = AfterTagEnd(end, end_sign == '-' ? '-' : end_sign == '+' ? '+' : 0, true);
      } else {
        DH_ASSIGN_OR_RETURN(end, LexTag(i, p, kind == '{'));
      }
      line_starting = s_[end - 1] == '\n';
      pos = end;
    }
    Emit(TokenKind::kEof, "", s_.size());
    return std::move(tokens_);
  }

 private:
  size_t FindTagStart(size_t from) const {
    for (size_t i = s_.find('{', from); i != std::string::npos; i = s_.find('{', i + 1)) {
      if (i + 1 < s_.size() && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  // Position after a tag's closing delimiter at `end`, consuming whitespace per its marker.
  size_t AfterTagEnd(size_t end, char sign, bool is_block) const {
    if (sign == '-') {
      while (end < s_.size() && IsSpace(s_[end])) ++end;
    } else if (sign != '+' && is_block && opt_.trim_blocks && end < s_.size() && s_[end] == '\n') {
      ++end;
    }
    return end;
  }

  // Lexes the inside of a {{ }} or {% %} tag that opened at `open`; returns the position after it.
  Result<size_t> LexTag(size_t open, size_t p, bool is_var) {
    Emit(is_var ? TokenKind::kVarBegin : TokenKind::kBlockBegin, "", open);
    const char close0 = is_var ? '}' : '%';
    int bracket_depth = 0;
    while (true) {
      while (p < s_.size() && IsSpace(s_[p])) ++p;
      if (p >= s_.size()) {
        return Error(
            open, is_var ? "unterminated '{{', expected '}}'" : "unterminated '{%', expected '%}'");
      }
      char c = s_[p];
      auto closes_at = [&](size_t q) {
        return bracket_depth == 0 && q + 1 < s_.size() && s_[q] == close0 && s_[q + 1] == '}';
      };
      if ((c == '-' || c == '+') && closes_at(p + 1) && !(c == '+' && is_var)) {
        Emit(is_var ? TokenKind::kVarEnd : TokenKind::kBlockEnd, "", p);
        return AfterTagEnd(p + 3, c, !is_var);
      }
      if (closes_at(p)) {
        Emit(is_var ? TokenKind::kVarEnd : TokenKind::kBlockEnd, "", p);
        return AfterTagEnd(p + 2, 0, !is_var);
      }
      if (IsNameStart(c)) {
        size_t q = p;
        while (q < s_.size() && IsNameChar(s_[q])) ++q;
        Emit(TokenKind::kName, s_.substr(p, q - p), p);
        p = q;
      } else if (IsDigit(c)) {
        DH_ASSIGN_OR_RETURN(p, LexNumber(p));
      } else if (c == '\'' || c == '"') {
        DH_ASSIGN_OR_RETURN(p, LexString(p));
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                     "/",  "%",  "~",  "<",  ">",  "(",  ")", "[", "]",
                                     "{",  "}",  ",",  ".",  ":",  "|",  "="};
        const char* found = nullptr;
        for (const char* op : kOps) {
          if (s_.compare(p, std::strlen(op), op) == 0) {
            found = op;
            break;
          }
        }
        if (!found) return Error(p, std::string("unexpected character '") + c + "'");
        if (c == '(' || c == '[' || c == '{') ++bracket_depth;
        if ((c == ')' || c == ']' || c == '}') && bracket_depth > 0) --bracket_depth;
        Emit(TokenKind::kOp, found, p);
        p += std::strlen(found);
      }
    }
  }

  Result<size_t> LexNumber(size_t p) {
    size_t start = p;
    std::string digits;
    auto take_digits = [&] {
      while (p < s_.size() &&
             (IsDigit(s_[p]) || (s_[p] == '_' && p + 1 < s_.size() && IsDigit(s_[p + 1])))) {
        if (s_[p] != '_') digits += s_[p];
        ++p;
      }
    };
    take_digits();
    bool is_float = false;
    if (p + 1 < s_.size() && s_[p] == '.' && IsDigit(s_[p + 1])) {
      is_float = true;
      digits += '.';
      ++p;
      take_digits();
    }
    if (p < s_.size() && (s_[p] == 'e' || s_[p] == 'E')) {
      size_t q = p + 1;
      if (q < s_.size() && (s_[q] == '+' || s_[q] == '-')) ++q;
      if (q < s_.size() && IsDigit(s_[q])) {
        is_float = true;
        digits += 'e';
        digits.append(s_, p + 1, q - p - 1);
        p = q;
        take_digits();
      }
    }
    Token t{is_float ? TokenKind::kFloat : TokenKind::kInt, digits};
    SetPos(t, start);
    if (is_float) {
      t.float_value = std::strtod(digits.c_str(), nullptr);
    } else {
      errno = 0;
      t.int_value = std::strtoll(digits.c_str(), nullptr, 10);
      if (errno == ERANGE) return Error(start, "integer literal out of range");
    }
    tokens_.push_back(std::move(t));
    return p;
  }

  Result<size_t> LexString(size_t p) {
    size_t start = p;
    char quote = s_[p++];
    std::string out;
    while (true) {
      if (p >= s_.size()) return Error(start, "unterminated string literal");
      char c = s_[p];
      if (c == quote) break;
      if (c != '\\' || p + 1 >= s_.size()) {
        out += c;
        ++p;
        continue;
      }
      char e = s_[p + 1];
      p += 2;
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case 'a':
          out += '\a';
          break;
        case '0':
          out += '\0';
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case '\n':
          break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (int k = 0; k < n; ++k) {
            int h = p < s_.size() ? HexValue(s_[p]) : -1;
            if (h < 0)
              return Error(p, std::string("truncated \\") + e + " escape in string literal");
            cp = cp * 16 + static_cast<uint32_t>(h);
            ++p;
          }
          if (cp > 0x10FFFF) return Error(p, "escape beyond U+10FFFF in string literal");
          AppendUtf8(static_cast<char32_t>(cp), &out);
          break;
        }
        default:
          out += '\\';
          out += e;
      }
    }
    Token t{TokenKind::kString, std::move(out)};
    SetPos(t, start);
    tokens_.push_back(std::move(t));
    return p + 1;
  }

  void SetPos(Token& t, size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    size_t line = static_cast<size_t>(it - line_starts_.begin());
    t.line = static_cast<int>(line);
    t.column = static_cast<int>(offset - line_starts_[line - 1]) + 1;
  }

  void Emit(TokenKind kind, std::string text, size_t offset) {
    if (kind == TokenKind::kText && text.empty()) return;
    Token t{kind, std::move(text)};
    SetPos(t, offset);
    tokens_.push_back(std::move(t));
  }

  Status Error(size_t offset, std::string_view what) const {
    Token t{TokenKind::kEof, ""};
    SetPos(t, offset);
    return InvalidArgument("template line {}, column {}: {}", t.line, t.column, what);
  }

  std::string s_;
  LexOptions opt_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

std::string NormalizeNewlines(std::string_view source, bool keep_trailing_newline) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!keep_trailing_newline && !out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

Result<std::vector<Token>> Tokenize(std::string_view source, const LexOptions& options) {
  Lexer lexer(NormalizeNewlines(source, options.keep_trailing_newline), options);
  return lexer.Run();
}

}  // namespace dh::chat::jinja
