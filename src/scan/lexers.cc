// The scan lexers for build and deploy files (shell, Dockerfile, YAML, requirements, TOML, CMake),
// file classification, and the entry point that picks a lexer (code: lexers_code.cc).
#include "scan/lexers.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <unordered_map>

#include "scan/lexer_text.h"

namespace dh::scan {
namespace lex {

// Adds the requirement atoms of one requirement-like string: the normalised project name and the
// whole spec (lower case), e.g. "Flash_Attn>=2.5" -> "flash-attn", "flash_attn>=2.5".
void AddRequirement(std::string_view spec, int line, int col, std::vector<Atom>* out) {
  while (!spec.empty() && IsSpace(spec.front())) spec.remove_prefix(1);
  while (!spec.empty() && (IsSpace(spec.back()) || spec.back() == '\n')) spec.remove_suffix(1);
  if (spec.empty() || spec.size() > 300 || spec.find('\n') != std::string_view::npos) return;
  size_t n = 0;
  while (n < spec.size() && (std::isalnum(static_cast<unsigned char>(spec[n])) || spec[n] == '-' ||
                             spec[n] == '_' || spec[n] == '.' || spec[n] == ':')) {
    ++n;
  }
  std::string name = Lower(spec.substr(0, n));
  std::replace(name.begin(), name.end(), '_', '-');
  if (!name.empty()) out->push_back({PatternKind::kReq, name, line, col, name});
  const std::string whole = Lower(spec);
  if (whole != name) out->push_back({PatternKind::kReq, whole, line, col, name});
}

}  // namespace lex

using lex::IsSpace;
using lex::Basename;
using lex::EndsWith;
using lex::StartsWith;
using lex::Lower;
using lex::Cursor;
using lex::AddRequirement;
using lex::LexPython;
using lex::LexC;

namespace {

// ------------------------------------------------------------------------------------ words

bool IsWordBreak(char c) {
  return IsSpace(c) || c == '"' || c == '\'' || c == '`' || c == '\n';
}
bool IsSubBreak(char c) {
  return std::strchr("=,;:()[]{}$|&<>\"'`", c) != nullptr;
}

// Emits a word and, when it has separators inside, its sub-words (same column, so a rule that
// matches both the word and a part of it is reported once).
void EmitWord(std::string_view w, int line, int col, std::vector<Atom>* out) {
  while (!w.empty() && (w.back() == ':' || w.back() == ',' || w.back() == ';' || w.back() == ')')) {
    w.remove_suffix(1);
  }
  if (w.empty()) return;
  out->push_back({PatternKind::kWord, std::string(w), line, col, ""});
  size_t s = 0;
  bool split = false;
  for (size_t k = 0; k <= w.size(); ++k) {
    if (k == w.size() || IsSubBreak(w[k])) {
      if (k < w.size()) split = true;
      if (split && k > s) {
        std::string_view part = w.substr(s, k - s);
        while (!part.empty() && part.back() == ':') part.remove_suffix(1);
        if (!part.empty()) out->push_back({PatternKind::kWord, std::string(part), line, col, ""});
      }
      s = k + 1;
    }
  }
}

// Shell, Dockerfile, YAML, Makefile, ini, JSON: a '#' comment starts at the line start or after a
// blank, outside quotes (never in JSON); words are split on blanks and quotes.
void LexWords(std::string_view text, FileClass cls, LexResult* out) {
  int line = 1;
  size_t pos = 0;
  bool in_docker_continuation = false;
  while (pos <= text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view l = text.substr(pos, eol - pos);
    // Cut the comment.
    size_t code_end = l.size();
    if (cls != FileClass::kJson) {
      char quote = 0;
      for (size_t k = 0; k < l.size(); ++k) {
        const char ch = l[k];
        if (quote) {
          if (ch == '\\' && quote == '"') {
            ++k;
          } else if (ch == quote) {
            quote = 0;
          }
          continue;
        }
        if (ch == '"' || ch == '\'') {
          quote = ch;
          continue;
        }
        if (ch == '#' && (k == 0 || IsSpace(l[k - 1]))) {
          code_end = k;
          const bool own = l.find_first_not_of(" \t") == k;
          out->comments.push_back({line, own, std::string(l.substr(k))});
          break;
        }
      }
    }
    std::string_view code = l.substr(0, code_end);
    // Words.
    std::vector<std::pair<std::string_view, int>> words;
    for (size_t k = 0; k < code.size();) {
      while (k < code.size() && IsWordBreak(code[k])) ++k;
      const size_t s = k;
      while (k < code.size() && !IsWordBreak(code[k])) ++k;
      if (k > s) words.push_back({code.substr(s, k - s), static_cast<int>(s) + 1});
    }
    for (const auto& [w, col] : words) EmitWord(w, line, col, &out->atoms);
    // "key: value" (YAML, compose files) -> "key:value".
    if (cls == FileClass::kYaml || cls == FileClass::kCondaEnv || cls == FileClass::kShell ||
        cls == FileClass::kDockerfile) {
      std::string_view t = code;
      const size_t first = t.find_first_not_of(" \t-");
      if (first != std::string_view::npos) {
        t = t.substr(first);
        const size_t colon = t.find(": ");
        if (colon != std::string_view::npos && colon > 0 &&
            t.substr(0, colon).find_first_of(" \t\"'") == std::string_view::npos) {
          std::string_view v = t.substr(colon + 2);
          while (!v.empty() && IsSpace(v.front())) v.remove_prefix(1);
          while (!v.empty() && IsSpace(v.back())) v.remove_suffix(1);
          if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front()) {
            v = v.substr(1, v.size() - 2);
          }
          std::string kv = std::string(t.substr(0, colon)) + ":";
          for (char ch : v) {
            if (!IsSpace(ch)) kv += ch;
          }
          out->atoms.push_back(
              {PatternKind::kWord, kv, line, static_cast<int>(first) + 1, ""});
        }
      }
    }
    // Conda environment list items are requirements ("- pytorch-cuda=12.1", "- flash-attn").
    if (cls == FileClass::kCondaEnv && !words.empty() && words[0].first == "-" && words.size() == 2) {
      AddRequirement(words[1].first, line, words[1].second, &out->atoms);
    }
    // pip / conda / uv install lines: the arguments are requirements.
    for (size_t k = 0; k + 1 < words.size(); ++k) {
      if (words[k].first == "install" || words[k].first == "add") {
        bool installer = false;
        for (size_t m = 0; m < k; ++m) {
          const std::string_view w = words[m].first;
          installer = installer || w == "pip" || w == "pip3" || w == "conda" || w == "mamba" ||
                      w == "uv" || EndsWith(w, "/pip") || EndsWith(w, "/pip3");
        }
        if (!installer) continue;
        for (size_t m = k + 1; m < words.size(); ++m) {
          const std::string_view w = words[m].first;
          if (w == "&&" || w == ";" || w == "|") break;
          if (!w.empty() && w.front() == '-' && w.find("://") == std::string_view::npos) continue;
          AddRequirement(w, line, words[m].second, &out->atoms);
        }
        break;
      }
    }
    // Dockerfile FROM (not inside a RUN continuation).
    if (cls == FileClass::kDockerfile && !in_docker_continuation && !words.empty() &&
        Lower(words[0].first) == "from") {
      for (size_t k = 1; k < words.size(); ++k) {
        if (StartsWith(words[k].first, "--")) continue;
        out->atoms.push_back(
            {PatternKind::kFrom, std::string(words[k].first), line, words[k].second, ""});
        break;
      }
    }
    if (cls == FileClass::kDockerfile) {
      std::string_view trimmed = code;
      while (!trimmed.empty() && IsSpace(trimmed.back())) trimmed.remove_suffix(1);
      in_docker_continuation = !trimmed.empty() && trimmed.back() == '\\';
    }
    ++line;
    pos = eol + 1;
  }
  out->lines = line - 1;
}

// requirements*.txt: one requirement (or pip option) per line; '#' comments.
void LexRequirements(std::string_view text, LexResult* out) {
  int line = 1;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view l = text.substr(pos, eol - pos);
    size_t hash = std::string_view::npos;
    for (size_t k = 0; k < l.size(); ++k) {
      if (l[k] == '#' && (k == 0 || IsSpace(l[k - 1]))) {
        hash = k;
        break;
      }
    }
    if (hash != std::string_view::npos) {
      out->comments.push_back(
          {line, l.find_first_not_of(" \t") == hash, std::string(l.substr(hash))});
      l = l.substr(0, hash);
    }
    const size_t first = l.find_first_not_of(" \t\r");
    if (first != std::string_view::npos) {
      std::string_view req = l.substr(first);
      if (req.front() == '-') {
        // Options: index URLs are requirements-like atoms (for cu12x wheel indexes).
        for (size_t k = 0; k < req.size();) {
          while (k < req.size() && (IsSpace(req[k]) || req[k] == '=')) ++k;
          const size_t s = k;
          while (k < req.size() && !IsSpace(req[k]) && req[k] != '=') ++k;
          if (k > s && req[s] != '-') {
            out->atoms.push_back({PatternKind::kReq, Lower(req.substr(s, k - s)), line,
                                  static_cast<int>(first + s) + 1, ""});
          }
        }
      } else {
        AddRequirement(req, line, static_cast<int>(first) + 1, &out->atoms);
      }
    }
    ++line;
    pos = eol + 1;
  }
  out->lines = line - 1;
}

// pyproject.toml: '#' comments outside strings; every string literal is a requirement candidate.
void LexToml(std::string_view text, LexResult* out) {
  Cursor c{text};
  while (!c.done()) {
    const char ch = c.peek();
    if (ch == '#') {
      const bool own = c.AtLineStartIgnoringBlanks();
      const int line = c.line;
      const size_t start = c.i;
      while (!c.done() && c.peek() != '\n') c.advance();
      out->comments.push_back({line, own, std::string(text.substr(start, c.i - start))});
      continue;
    }
    if (ch == '"' || ch == '\'') {
      const bool triple = c.peek(1) == ch && c.peek(2) == ch;
      const int line = c.line, col = c.col();
      c.advance(triple ? 3 : 1);
      const size_t start = c.i;
      size_t end = start;
      while (!c.done()) {
        if (ch == '"' && c.peek() == '\\') {
          c.advance(2);
          continue;
        }
        if (!triple && c.peek() == '\n') break;
        if (c.peek() == ch && (!triple || (c.peek(1) == ch && c.peek(2) == ch))) {
          end = c.i;
          c.advance(triple ? 3 : 1);
          break;
        }
        c.advance();
        end = c.i;
      }
      AddRequirement(text.substr(start, end - start), line, col, &out->atoms);
      continue;
    }
    c.advance();
  }
}

// CMake: '#' and '#[[...]]' comments, quoted and bracket arguments. Every argument (and each
// blank-separated word of a quoted one) is a word; "command(ARG" is emitted too so rules can say
// find_package(CUDA...) or enable_language(CUDA).
void LexCMake(std::string_view text, LexResult* out) {
  Cursor c{text};
  std::string command;   // the command whose arguments we are in (lower case)
  std::string pending;   // the last identifier seen at depth 0
  int depth = 0;
  auto emit_arg = [&](std::string_view arg, int line, int col) {
    for (size_t k = 0; k < arg.size();) {
      while (k < arg.size() && (IsSpace(arg[k]) || arg[k] == '\n' || arg[k] == ';')) ++k;
      const size_t s = k;
      while (k < arg.size() && !IsSpace(arg[k]) && arg[k] != '\n' && arg[k] != ';') ++k;
      if (k > s) {
        const std::string_view w = arg.substr(s, k - s);
        EmitWord(w, line, col, &out->atoms);
        if (!command.empty()) {
          out->atoms.push_back({PatternKind::kWord, command + "(" + std::string(w), line, col, ""});
        }
      }
    }
  };
  while (!c.done()) {
    const char ch = c.peek();
    if (ch == '#') {
      const bool own = c.AtLineStartIgnoringBlanks();
      const int line = c.line;
      const size_t start = c.i;
      size_t eq = 0;
      while (c.peek(1 + 1 + eq) == '=') ++eq;
      if (c.peek(1) == '[' && c.peek(2 + eq) == '[') {
        const std::string close = "]" + std::string(eq, '=') + "]";
        const size_t e = text.find(close, c.i);
        c.advance((e == std::string_view::npos ? text.size() : e + close.size()) - c.i);
      } else {
        while (!c.done() && c.peek() != '\n') c.advance();
      }
      out->comments.push_back({line, own, std::string(text.substr(start, c.i - start))});
      continue;
    }
    if (ch == '"') {
      const int line = c.line, col = c.col();
      c.advance();
      const size_t start = c.i;
      while (!c.done() && c.peek() != '"') {
        if (c.peek() == '\\') c.advance();
        c.advance();
      }
      const size_t end = std::min(c.i, text.size());
      c.advance();
      emit_arg(text.substr(start, end - start), line, col);
      continue;
    }
    if (ch == '(') {
      if (depth == 0) command = Lower(pending);
      ++depth;
      c.advance();
      continue;
    }
    if (ch == ')') {
      if (depth > 0 && --depth == 0) command.clear();
      c.advance();
      continue;
    }
    if (IsSpace(ch) || ch == '\n') {
      c.advance();
      continue;
    }
    const int line = c.line, col = c.col();
    const size_t start = c.i;
    while (!c.done() && !IsSpace(c.peek()) && c.peek() != '\n' && c.peek() != '(' &&
           c.peek() != ')' && c.peek() != '"' && c.peek() != '#') {
      c.advance();
    }
    const std::string_view w = text.substr(start, c.i - start);
    if (depth == 0) {
      pending = std::string(w);
    } else {
      emit_arg(w, line, col);
    }
  }
}

}  // namespace

const char* FileClassName(FileClass c) {
  switch (c) {
    case FileClass::kPython: return "python";
    case FileClass::kSetupPy: return "setup.py";
    case FileClass::kC: return "c/c++";
    case FileClass::kCuda: return "cuda";
    case FileClass::kCMake: return "cmake";
    case FileClass::kShell: return "shell";
    case FileClass::kDockerfile: return "dockerfile";
    case FileClass::kYaml: return "yaml";
    case FileClass::kCondaEnv: return "conda-env";
    case FileClass::kRequirements: return "requirements";
    case FileClass::kToml: return "pyproject";
    case FileClass::kJson: return "json";
    case FileClass::kOther: return "other";
  }
  return "?";
}

FileClass ClassifyPath(std::string_view path) {
  const std::string_view base = Basename(path);
  const std::string lower = Lower(base);
  const std::string_view b = lower;
  if (b == "setup.py") return FileClass::kSetupPy;
  if (EndsWith(b, ".py") || EndsWith(b, ".pyi")) return FileClass::kPython;
  if (EndsWith(b, ".cu") || EndsWith(b, ".cuh")) return FileClass::kCuda;
  for (const char* ext : {".c", ".cc", ".cpp", ".cxx", ".h", ".hpp", ".hh", ".hxx", ".inl", ".inc",
                          ".ipp", ".tpp"}) {
    if (EndsWith(b, ext)) return FileClass::kC;
  }
  if (b == "cmakelists.txt" || EndsWith(b, ".cmake")) return FileClass::kCMake;
  if (StartsWith(b, "requirements") && (EndsWith(b, ".txt") || EndsWith(b, ".in"))) {
    return FileClass::kRequirements;
  }
  if (StartsWith(b, "constraints") && EndsWith(b, ".txt")) return FileClass::kRequirements;
  if (b == "pyproject.toml") return FileClass::kToml;
  if (StartsWith(b, "dockerfile") || StartsWith(b, "containerfile") || EndsWith(b, ".dockerfile")) {
    return FileClass::kDockerfile;
  }
  if ((StartsWith(b, "environment") || StartsWith(b, "conda")) &&
      (EndsWith(b, ".yml") || EndsWith(b, ".yaml"))) {
    return FileClass::kCondaEnv;
  }
  if (EndsWith(b, ".yml") || EndsWith(b, ".yaml")) return FileClass::kYaml;
  if (EndsWith(b, ".sh") || EndsWith(b, ".bash") || EndsWith(b, ".zsh") || b == "makefile" ||
      b == "gnumakefile" || EndsWith(b, ".mk") || b == ".env" || EndsWith(b, ".env") ||
      EndsWith(b, ".service") || b == "setup.cfg" || EndsWith(b, ".slurm") ||
      EndsWith(b, ".sbatch") || EndsWith(b, ".bzl") || b == "build" || b == "build.bazel" ||
      EndsWith(b, ".ini") || EndsWith(b, ".conf")) {
    return FileClass::kShell;
  }
  if (EndsWith(b, ".json")) return FileClass::kJson;
  return FileClass::kOther;
}

LexResult Lex(FileClass cls, std::string_view text) {
  LexResult out;
  switch (cls) {
    case FileClass::kPython: LexPython(text, false, &out); break;
    case FileClass::kSetupPy: LexPython(text, true, &out); break;
    case FileClass::kC: LexC(text, false, &out); break;
    case FileClass::kCuda: LexC(text, true, &out); break;
    case FileClass::kCMake: LexCMake(text, &out); break;
    case FileClass::kRequirements: LexRequirements(text, &out); break;
    case FileClass::kToml: LexToml(text, &out); break;
    case FileClass::kShell:
    case FileClass::kDockerfile:
    case FileClass::kYaml:
    case FileClass::kCondaEnv:
    case FileClass::kJson: LexWords(text, cls, &out); break;
    case FileClass::kOther: break;
  }
  if (out.lines == 0) {
    out.lines = static_cast<int>(std::count(text.begin(), text.end(), '\n')) +
                (text.empty() || text.back() == '\n' ? 0 : 1);
  }
  return out;
}

}  // namespace dh::scan
