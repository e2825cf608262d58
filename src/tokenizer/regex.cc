// PCRE2 wrapper: compile once, match with JIT on a per-thread heap stack, fall back to the
// heap-limited interpreter when JIT is unavailable or runs out of stack.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

namespace dh::tok {
namespace {

constexpr size_t kJitStackMax = 64 << 20;
constexpr uint32_t kHeapLimitKiB = 256 << 10;

std::string PcreMessage(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

// Per-thread match resources: a JIT stack large enough for long inputs and a match context.
struct ThreadMatchState {
  pcre2_jit_stack* jit_stack = nullptr;
  pcre2_match_context* context = nullptr;
  ThreadMatchState() {
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 << 10, kJitStackMax, nullptr);
    if (context != nullptr) {
      if (jit_stack != nullptr) pcre2_jit_stack_assign(context, nullptr, jit_stack);
      pcre2_set_heap_limit(context, kHeapLimitKiB);
    }
  }
  ~ThreadMatchState() {
    if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
    if (context != nullptr) pcre2_match_context_free(context);
  }
};

ThreadMatchState& MatchState() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

Regex::~Regex() = default;

Result<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern) {
  std::unique_ptr<Regex> re(new Regex());
  re->pattern_ = std::string(pattern);
  re->code_ = std::make_unique<Code>();
  int error = 0;
  PCRE2_SIZE offset = 0;
  re->code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                  PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (re->code_->code == nullptr) {
    return InvalidArgument("regex /{}/: {} at offset {}", pattern, PcreMessage(error), offset);
  }
  re->jit_ = pcre2_jit_compile(re->code_->code, PCRE2_JIT_COMPLETE) == 0;
  return re;
}

Result<std::unique_ptr<Regex>> Regex::Literal(std::string_view text) {
  std::string quoted = "\\Q";
  // \E inside the text would end the quoting early; split it out.
  for (size_t pos = 0; pos < text.size();) {
    const size_t e = text.find("\\E", pos);
    if (e == std::string_view::npos) {
      quoted.append(text.substr(pos));
      break;
    }
    quoted.append(text.substr(pos, e - pos));
    quoted.append("\\E\\\\E\\Q");
    pos = e + 2;
  }
  quoted.append("\\E");
  return Compile(quoted);
}

Status Regex::FindAll(std::string_view subject, std::vector<std::pair<size_t, size_t>>* out) const {
  ThreadMatchState& state = MatchState();
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  if (md == nullptr) return ResourceExhausted("regex /{}/: out of memory", pattern_);
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t start = 0;
  Status status;
  while (start <= subject.size()) {
    int rc = -1;
    bool done = false;
    if (jit_) {
      rc = pcre2_jit_match(code_->code, s, subject.size(), start, 0, md, state.context);
      done = rc != PCRE2_ERROR_JIT_STACKLIMIT;
    }
    if (!done) {
      rc = pcre2_match(code_->code, s, subject.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md,
                       state.context);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      status = ResourceExhausted("regex /{}/ failed on a {}-byte input: {}", pattern_,
                                 subject.size(), PcreMessage(rc));
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0], e = ov[1];
    out->emplace_back(b, e);
    if (e > b) {
      start = e;
    } else {
      // Empty match: step over one whole code point.
      if (e >= subject.size()) break;
      start = e + 1;
      while (start < subject.size() && (static_cast<uint8_t>(subject[start]) & 0xC0) == 0x80) {
        ++start;
      }
    }
  }
  pcre2_match_data_free(md);
  return status;
}

}  // namespace dh::tok
