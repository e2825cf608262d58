// Lexer for the Jinja subset: splits a template into text and tag tokens, applying whitespace
// control (`-`/`+` markers, trim_blocks, lstrip_blocks) the way Jinja2's lexer does.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dh::chat::jinja {

enum class TokenKind {
  kText,
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof,
};

struct Token {
  TokenKind kind;
  std::string text;  // text, name, decoded string literal or operator
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
  int column = 1;
};

struct LexOptions {
  bool trim_blocks = true;    // drop the first newline after a block or comment tag
  bool lstrip_blocks = true;  // drop spaces/tabs before a block or comment tag on its line
  bool keep_trailing_newline = false;
};

// Fails with "line L, column C: ..." on unterminated tags, strings or unknown characters.
Result<std::vector<Token>> Tokenize(std::string_view source, const LexOptions& options = {});

}  // namespace dh::chat::jinja
