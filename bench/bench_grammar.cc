// Structured-output costs on a real vocabulary: grammar compile time and the per-token mask cost
// (mean and p99, without and with the mask cache) for 5 JSON Schemas of growing size, walking
// the tokens of a valid instance of each. "uncached" is the automaton walk (ComputeMask) from a
// state not in the cache; "stepping" is the plain walk (one grammar step per trie node) it
// replaced, for comparison on the same machine and load.
//
//   bench_grammar [TOKENIZER_DIR]   (default ../shared/data/tokenizers/deepseek-v3)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/compilers.h"
#include "grammar/token_mask.h"
#include "tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct Case {
  const char* name;
  const char* schema;
  const char* instance;
};

const Case kCases[] = {
    {"1 enum", R"({"enum":["red","green","blue"]})", R"("green")"},
    {"2 flat object",
     R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0,"maximum":150}},"required":["name","age"]})",
     R"({"age":42,"name":"Juliet Capulet of Verona"})"},
    {"3 array of objects",
     R"({"type":"array","items":{"type":"object","properties":{"id":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}},"score":{"type":"number"}},"required":["id","tags"]}})",
     R"([{"id":1,"score":0.5,"tags":["a","bb"]},{"id":22,"tags":["thou art more lovely"]},{"id":333,"score":-1e3,"tags":[]}])"},
    {"4 nested + formats",
     R"({"type":"object","properties":{"event":{"type":"object","properties":{"title":{"type":"string","maxLength":64},"when":{"type":"string","format":"date-time"},"where":{"type":"object","properties":{"city":{"type":"string"},"lat":{"type":"number","minimum":-90,"maximum":90}},"required":["city","lat"]}},"required":["title","when","where"]},"attendees":{"type":"array","items":{"type":"object","properties":{"email":{"type":"string","format":"email"},"role":{"enum":["host","guest"]}},"required":["email","role"]},"maxItems":10}},"required":["event","attendees"]})",
     R"({"attendees":[{"email":"romeo@verona.it","role":"guest"},{"email":"nurse@capulet.it","role":"host"}],"event":{"title":"A feast at the Capulets","when":"2024-07-14T20:30:00Z","where":{"city":"Verona","lat":45}}})"},
    {"5 recursive $defs",
     R"({"$ref":"#/$defs/node","$defs":{"node":{"type":"object","properties":{"name":{"type":"string"},"value":{"anyOf":[{"type":"integer"},{"type":"string"},{"type":"null"}]},"children":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["name","children"]}}})",
     R"({"children":[{"children":[{"children":[],"name":"leaf one","value":7},{"children":[],"name":"leaf two","value":null}],"name":"branch","value":"x"}],"name":"root"})"},
};

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "../shared/data/tokenizers/deepseek-v3";
  auto tokenizer = dh::Tokenizer::Load(dir);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "error: %s: %s\n", dir.c_str(), tokenizer.status().message().c_str());
    return 2;
  }
  const auto t0 = Clock::now();
  auto vocab = dh::grammar::TokenVocab::FromTokenizer(**tokenizer, (*tokenizer)->vocab_size());
  std::printf("vocabulary: %s, %d tokens, trie %zu nodes, built in %.1f ms\n", dir.c_str(), vocab->size(),
              vocab->trie().byte.size(), Ms(Clock::now() - t0));
  std::printf("%-22s %10s %7s %14s %14s %14s %14s %14s\n", "schema", "compile ms", "tokens",
              "uncached mean", "uncached p99", "cached mean", "stepping mean", "stepping p99");
  for (const Case& c : kCases) {
    const auto c0 = Clock::now();
    auto g = dh::grammar::CompileJsonSchema(nlohmann::json::parse(c.schema), {}, nullptr);
    if (!g.ok()) {
      std::fprintf(stderr, "error: %s: %s\n", c.name, g.status().message().c_str());
      return 1;
    }
    auto compiled = std::make_shared<dh::grammar::CompiledGrammar>(std::move(g).value(), vocab);
    const double compile_ms = Ms(Clock::now() - c0);  // schema -> grammar -> byte classes
    auto ids = (*tokenizer)->Encode(c.instance, false);
    if (!ids.ok()) return 1;
    dh::grammar::TokenMatcher m(compiled);
    std::vector<double> cold, warm, stepping;
    for (int32_t id : *ids) {
      const auto a = Clock::now();
      dh::grammar::TokenBitmask mask = m.ComputeMask();
      cold.push_back(Ms(Clock::now() - a));
      if (!dh::grammar::TestBit(mask, id)) {
        std::fprintf(stderr, "error: %s: token %d of the instance is masked\n", c.name, id);
        return 1;
      }
      const auto s0 = Clock::now();
      const dh::grammar::TokenBitmask plain = m.ComputeMaskStepping();
      stepping.push_back(Ms(Clock::now() - s0));
      if (plain != mask) {
        std::fprintf(stderr, "error: %s: the two walks disagree\n", c.name);
        return 1;
      }
      m.AllowedTokens();  // fills the cache
      const auto b = Clock::now();
      m.AllowedTokens();
      warm.push_back(Ms(Clock::now() - b));
      m.AcceptToken(id);
    }
    if (!m.IsAccepting()) {
      std::fprintf(stderr, "error: %s: the instance does not complete the grammar\n", c.name);
      return 1;
    }
    auto mean = [](const std::vector<double>& v) {
      double s = 0;
      for (double x : v) s += x;
      return s / static_cast<double>(v.size());
    };
    auto p99 = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[std::min(v.size() - 1, static_cast<size_t>(0.99 * static_cast<double>(v.size())))];
    };
    std::printf("%-22s %10.2f %7zu %14.3f %14.3f %14.4f %14.3f %14.3f\n", c.name, compile_ms, ids->size(),
                mean(cold), p99(cold), mean(warm), mean(stepping), p99(stepping));
  }
  return 0;
}
