// The scan lexers for code: Python (a tokenizer, import aliases resolved to dotted names) and
// C/C++/CUDA (identifiers, includes, __global__ kernels); comments are kept for suppressions.
#include <cstring>
#include <unordered_map>

#include "scan/lexer_text.h"

namespace dh::scan::lex {
namespace {

// ------------------------------------------------------------------------------------ Python

struct PyTok {
  enum Type { kName, kString, kNumber, kOp, kNewline } type;
  std::string text;  // name, operator, or a string's content (without prefix and quotes)
  int line, col;
};

void LexPythonTokens(std::string_view text, std::vector<PyTok>* toks, LexResult* out) {
  Cursor c{text};
  int depth = 0;  // bracket depth: newlines inside brackets do not end a statement
  while (!c.done()) {
    const char ch = c.peek();
    if (ch == '\n') {
      if (depth == 0) toks->push_back({PyTok::kNewline, "", c.line, c.col()});
      c.advance();
      continue;
    }
    if (IsSpace(ch) || ch == '\\') {
      c.advance();
      continue;
    }
    if (ch == '#') {
      const bool own = c.AtLineStartIgnoringBlanks();
      const int line = c.line;
      const size_t start = c.i;
      while (!c.done() && c.peek() != '\n') c.advance();
      out->comments.push_back({line, own, std::string(text.substr(start, c.i - start))});
      continue;
    }
    // String literal, possibly with a prefix of up to two letters (r, b, u, f and pairs).
    size_t plen = 0;
    while (plen < 2 && std::strchr("rRbBuUfF", c.peek(plen)) != nullptr && c.peek(plen) != '\0') {
      ++plen;
    }
    if ((c.peek(plen) == '"' || c.peek(plen) == '\'') &&
        (plen == 0 || !IsIdentChar(static_cast<unsigned char>(c.i > 0 ? text[c.i - 1] : ' ')))) {
      bool raw = false;
      for (size_t k = 0; k < plen; ++k) raw = raw || c.peek(k) == 'r' || c.peek(k) == 'R';
      const int line = c.line, col = c.col();
      c.advance(plen);
      const char q = c.peek();
      const bool triple = c.peek(1) == q && c.peek(2) == q;
      c.advance(triple ? 3 : 1);
      const size_t start = c.i;
      size_t end = start;
      while (!c.done()) {
        const char d = c.peek();
        if (d == '\\') {
          c.advance(2);  // an escaped character (also keeps a raw string's \" inside it)
          continue;
        }
        if (!triple && d == '\n') {  // unterminated: stop at the line end
          end = c.i;
          break;
        }
        if (d == q && (!triple || (c.peek(1) == q && c.peek(2) == q))) {
          end = c.i;
          c.advance(triple ? 3 : 1);
          break;
        }
        c.advance();
        end = c.i;
      }
      (void)raw;
      toks->push_back({PyTok::kString, std::string(text.substr(start, end - start)), line, col});
      continue;
    }
    if (IsIdentStart(static_cast<unsigned char>(ch))) {
      const int line = c.line, col = c.col();
      const size_t start = c.i;
      while (!c.done() && IsIdentChar(static_cast<unsigned char>(c.peek()))) c.advance();
      toks->push_back({PyTok::kName, std::string(text.substr(start, c.i - start)), line, col});
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(ch))) {
      const int line = c.line, col = c.col();
      const size_t start = c.i;
      while (!c.done() && (IsIdentChar(static_cast<unsigned char>(c.peek())) || c.peek() == '.')) {
        c.advance();
      }
      toks->push_back({PyTok::kNumber, std::string(text.substr(start, c.i - start)), line, col});
      continue;
    }
    if (ch == '(' || ch == '[' || ch == '{') ++depth;
    if ((ch == ')' || ch == ']' || ch == '}') && depth > 0) --depth;
    toks->push_back({PyTok::kOp, std::string(1, ch), c.line, c.col()});
    c.advance();
  }
  toks->push_back({PyTok::kNewline, "", c.line, c.col()});
}

// Reads a dotted name starting at toks[i]; returns the index after it.
size_t ReadDotted(const std::vector<PyTok>& t, size_t i, std::string* name) {
  name->clear();
  while (i < t.size() && t[i].type == PyTok::kName) {
    *name += t[i].text;
    if (i + 2 < t.size() && t[i + 1].type == PyTok::kOp && t[i + 1].text == "." &&
        t[i + 2].type == PyTok::kName) {
      *name += '.';
      i += 2;
    } else {
      return i + 1;
    }
  }
  return i;
}

bool IsOp(const std::vector<PyTok>& t, size_t i, const char* op) {
  return i < t.size() && t[i].type == PyTok::kOp && t[i].text == op;
}
bool IsName(const std::vector<PyTok>& t, size_t i, const char* name) {
  return i < t.size() && t[i].type == PyTok::kName && t[i].text == name;
}

}  // namespace

void LexPython(std::string_view text, bool setup_py, LexResult* out) {
  std::vector<PyTok> t;
  LexPythonTokens(text, &t, out);
  std::unordered_map<std::string, std::string> alias;  // local name -> qualified name
  std::vector<char> consumed(t.size(), 0);

  // Pass 1: imports. `import a.b as c`, `import a.b`, `from a.b import c as d, e`.
  for (size_t i = 0; i < t.size(); ++i) {
    if (IsName(t, i, "import") && (i == 0 || !IsName(t, i - 1, "from"))) {
      const bool at_stmt = i == 0 || t[i - 1].type == PyTok::kNewline || IsOp(t, i - 1, ";") ||
                           IsOp(t, i - 1, ":");
      if (!at_stmt) continue;
      size_t j = i + 1;
      while (j < t.size()) {
        std::string mod;
        const size_t k = ReadDotted(t, j, &mod);
        if (mod.empty()) break;
        const PyTok& first = t[j];
        std::string local;
        size_t next = k;
        if (IsName(t, k, "as") && k + 1 < t.size() && t[k + 1].type == PyTok::kName) {
          local = t[k + 1].text;
          alias[local] = mod;
          next = k + 2;
        } else {
          local = mod.substr(0, mod.find('.'));
          if (!alias.count(local)) alias[local] = local;
        }
        for (size_t m = i; m < next; ++m) consumed[m] = 1;
        out->atoms.push_back({PatternKind::kPyName, mod, first.line, first.col, ""});
        if (!IsOp(t, next, ",")) break;
        j = next + 1;
      }
    } else if (IsName(t, i, "from")) {
      const bool at_stmt = i == 0 || t[i - 1].type == PyTok::kNewline || IsOp(t, i - 1, ";") ||
                           IsOp(t, i - 1, ":");
      if (!at_stmt) continue;
      size_t j = i + 1;
      if (IsOp(t, j, ".")) continue;  // relative import: our own package, not a dependency
      std::string mod;
      j = ReadDotted(t, j, &mod);
      if (mod.empty() || !IsName(t, j, "import")) continue;
      ++j;
      const bool paren = IsOp(t, j, "(");
      if (paren) ++j;
      while (j < t.size()) {
        if (paren) {
          while (j < t.size() && t[j].type == PyTok::kNewline) ++j;
        }
        if (IsOp(t, j, "*")) {
          ++j;
          break;
        }
        if (j >= t.size() || t[j].type != PyTok::kName) break;
        const PyTok& name = t[j];
        std::string local = name.text;
        ++j;
        if (IsName(t, j, "as") && j + 1 < t.size() && t[j + 1].type == PyTok::kName) {
          local = t[j + 1].text;
          j += 2;
        }
        const std::string qualified = mod + "." + name.text;
        alias[local] = qualified;
        out->atoms.push_back({PatternKind::kPyName, qualified, name.line, name.col, ""});
        if (!IsOp(t, j, ",")) break;
        ++j;
      }
      if (paren && IsOp(t, j, ")")) ++j;
      for (size_t m = i; m < j && m < t.size(); ++m) consumed[m] = 1;
    }
  }

  // Pass 2: names, method calls, identifiers and strings.
  for (size_t i = 0; i < t.size(); ++i) {
    if (consumed[i]) continue;
    const PyTok& tok = t[i];
    if (tok.type == PyTok::kString) {
      out->atoms.push_back({PatternKind::kPyString, tok.text, tok.line, tok.col, ""});
      if (setup_py) AddRequirement(tok.text, tok.line, tok.col, &out->atoms);
      continue;
    }
    if (tok.type != PyTok::kName) continue;
    const bool after_dot = i > 0 && IsOp(t, i - 1, ".");
    out->atoms.push_back({PatternKind::kPyIdent, tok.text, tok.line, tok.col, ""});
    if (after_dot) {
      // A name after a call or subscript, e.g. model(x).cuda(): only the method call matters.
      if (IsOp(t, i + 1, "(")) {
        out->atoms.push_back({PatternKind::kPyCall, tok.text, tok.line, tok.col, ""});
      }
      continue;
    }
    std::string chain;
    const size_t end = ReadDotted(t, i, &chain);
    // Identifiers inside the chain (after the root) also count as identifiers.
    for (size_t m = i + 2; m < end; m += 2) {
      out->atoms.push_back({PatternKind::kPyIdent, t[m].text, t[m].line, t[m].col, ""});
    }
    const size_t dot = chain.find('.');
    const std::string root = chain.substr(0, dot);
    auto it = alias.find(root);
    if (it != alias.end()) {
      std::string q = it->second;
      if (dot != std::string::npos) q += chain.substr(dot);
      out->atoms.push_back({PatternKind::kPyName, q, tok.line, tok.col, ""});
    }
    if (dot != std::string::npos && IsOp(t, end, "(")) {
      const PyTok& last = t[end - 1];
      out->atoms.push_back({PatternKind::kPyCall, last.text, last.line, last.col, ""});
    }
    i = end - 1;
  }
}

// ------------------------------------------------------------------------------------ C/C++

void LexC(std::string_view text, bool cuda, LexResult* out) {
  Cursor c{text};
  struct CTok {
    std::string text;
    int line, col;
    bool ident;
  };
  std::vector<CTok> toks;
  while (!c.done()) {
    const char ch = c.peek();
    if (ch == '\n' || IsSpace(ch) || ch == '\\') {
      c.advance();
      continue;
    }
    if (ch == '/' && c.peek(1) == '/') {
      const bool own = c.AtLineStartIgnoringBlanks();
      const int line = c.line;
      const size_t start = c.i;
      while (!c.done() && c.peek() != '\n') {
        if (c.peek() == '\\' && c.peek(1) == '\n') c.advance();  // continued comment
        c.advance();
      }
      out->comments.push_back({line, own, std::string(text.substr(start, c.i - start))});
      continue;
    }
    if (ch == '/' && c.peek(1) == '*') {
      const bool own = c.AtLineStartIgnoringBlanks();
      const int line = c.line;
      const size_t start = c.i;
      c.advance(2);
      while (!c.done() && !(c.peek() == '*' && c.peek(1) == '/')) c.advance();
      c.advance(2);
      out->comments.push_back({line, own, std::string(text.substr(start, c.i - start))});
      continue;
    }
    if (ch == '#' && c.AtLineStartIgnoringBlanks()) {
      // Preprocessor directive: an #include's header name is an atom; other directives are
      // lexed as ordinary tokens (so #ifdef __CUDACC__ is seen).
      size_t k = c.i + 1;
      while (k < text.size() && IsSpace(text[k])) ++k;
      if (text.substr(k, 7) == "include") {
        size_t h = k + 7;
        while (h < text.size() && IsSpace(text[h])) ++h;
        if (h < text.size() && (text[h] == '<' || text[h] == '"')) {
          const char close = text[h] == '<' ? '>' : '"';
          const size_t e = text.find_first_of(std::string{close, '\n'}, h + 1);
          if (e != std::string_view::npos && text[e] == close) {
            const int line = c.line, col = c.col();
            out->atoms.push_back(
                {PatternKind::kInclude, std::string(text.substr(h + 1, e - h - 1)), line, col, ""});
            c.advance(e + 1 - c.i);
            continue;
          }
        }
      }
      c.advance();
      continue;
    }
    if (ch == '"' || ch == '\'') {
      // A ' between digits is a C++14 digit separator, handled with numbers below.
      c.advance();
      while (!c.done() && c.peek() != ch && c.peek() != '\n') {
        if (c.peek() == '\\') c.advance();
        c.advance();
      }
      c.advance();
      continue;
    }
    if (IsIdentStart(static_cast<unsigned char>(ch))) {
      const int line = c.line, col = c.col();
      const size_t start = c.i;
      while (!c.done() && IsIdentChar(static_cast<unsigned char>(c.peek()))) c.advance();
      std::string_view word = text.substr(start, c.i - start);
      // Raw string literal: R"delim( ... )delim" with an optional encoding prefix.
      if (c.peek() == '"' && (word == "R" || word == "LR" || word == "uR" || word == "UR" ||
                              word == "u8R")) {
        const size_t open = text.find('(', c.i);
        if (open != std::string_view::npos && open - c.i <= 17) {
          const std::string close =
              ")" + std::string(text.substr(c.i + 1, open - c.i - 1)) + "\"";
          const size_t e = text.find(close, open);
          const size_t stop = e == std::string_view::npos ? text.size() : e + close.size();
          c.advance(stop - c.i);
          continue;
        }
      }
      toks.push_back({std::string(word), line, col, true});
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(ch))) {
      while (!c.done() && (IsIdentChar(static_cast<unsigned char>(c.peek())) || c.peek() == '.' ||
                           (c.peek() == '\'' && std::isxdigit(static_cast<unsigned char>(c.peek(1)))))) {
        c.advance();
      }
      continue;
    }
    if (ch == '<' && c.peek(1) == '<' && c.peek(2) == '<') {
      toks.push_back({"<<<", c.line, c.col(), false});
      c.advance(3);
      continue;
    }
    if (ch == ':' && c.peek(1) == ':') {
      toks.push_back({"::", c.line, c.col(), false});
      c.advance(2);
      continue;
    }
    toks.push_back({std::string(1, ch), c.line, c.col(), false});
    c.advance();
  }
  (void)cuda;
  for (size_t i = 0; i < toks.size(); ++i) {
    const CTok& tok = toks[i];
    if (!tok.ident) {
      if (tok.text == "<<<") out->atoms.push_back({PatternKind::kC, "<<<", tok.line, tok.col, ""});
      continue;
    }
    if (i > 0 && toks[i - 1].text == "::" && i > 1 && toks[i - 2].ident) continue;  // mid-chain
    std::string chain = tok.text;
    size_t j = i;
    while (j + 2 < toks.size() && toks[j + 1].text == "::" && toks[j + 2].ident) {
      chain += "::" + toks[j + 2].text;
      j += 2;
    }
    Atom a{PatternKind::kC, chain, tok.line, tok.col, ""};
    if (tok.text == "__global__") {
      // The kernel's name: the identifier just before the first '(' that follows.
      for (size_t k = i + 1; k + 1 < toks.size() && k < i + 40; ++k) {
        if (toks[k].ident && toks[k + 1].text == "(") {
          a.symbol = "__global__ " + toks[k].text;
          break;
        }
        if (toks[k].text == ";" || toks[k].text == "{") break;
      }
    }
    out->atoms.push_back(std::move(a));
  }
}

}  // namespace dh::scan::lex
