// The grammar engine and its compilers: acceptance of whole strings, rejection of prefixes that
// cannot continue, errors naming the construct, and token masks equal to a brute-force check.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "grammar/compilers.h"
#include "grammar/grammar.h"
#include "grammar/token_mask.h"

namespace dh::grammar {
namespace {

// True when `text` is a complete sentence of `g`.
bool Matches(const Grammar& g, std::string_view text) {
  GrammarMatcher m(&g);
  return m.AcceptBytes(text) && m.IsAccepting();
}

Grammar Must(Result<Grammar> g) {
  EXPECT_TRUE(g.ok()) << g.status().message();
  return g.ok() ? std::move(g).value() : Grammar{};
}

TEST(Grammar, RepeatBoundsAndSeparator) {
  GrammarBuilder b;
  const int32_t root = b.NewRule("root");
  auto rep = b.Repeat("r", GrammarBuilder::Literal("ab"), 2, 4, GrammarBuilder::Literal(","));
  ASSERT_TRUE(rep.ok());
  b.AddAlt(root, {GrammarBuilder::Ref(*rep)});
  Grammar g = Must(b.Build());
  EXPECT_FALSE(Matches(g, "ab"));
  EXPECT_TRUE(Matches(g, "ab,ab"));
  EXPECT_TRUE(Matches(g, "ab,ab,ab,ab"));
  EXPECT_FALSE(Matches(g, "ab,ab,ab,ab,ab"));
  EXPECT_FALSE(Matches(g, "abab"));
}

TEST(Grammar, UnboundedRepeatKeepsTheStackFlat) {
  Grammar g = Must(CompileRegex("(ab)*c"));
  GrammarMatcher m(&g);
  for (int i = 0; i < 20000; ++i) ASSERT_TRUE(m.AcceptBytes("ab"));
  EXPECT_TRUE(m.AcceptBytes("c"));
  EXPECT_TRUE(m.IsAccepting());
  std::vector<int32_t> key;
  m.StateKey(&key);
  EXPECT_LT(key.size(), 8u);
}

TEST(Grammar, LeftRecursionIsRejected) {
  auto g = CompileGbnf("root ::= root \"a\" | \"b\"");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("left-recursive"), std::string::npos);
}

TEST(Grammar, CodePointRangesAreUtf8) {
  GrammarBuilder b;
  const int32_t root = b.NewRule("root");
  const int32_t cp = b.CodePointRanges("cp", {{0x41, 0x41}, {0xE9, 0xE9}, {0x4E00, 0x9FFF}, {0x1F600, 0x1F64F}});
  b.AddAlt(root, {GrammarBuilder::Ref(cp)});
  Grammar g = Must(b.Build());
  EXPECT_TRUE(Matches(g, "A"));
  EXPECT_TRUE(Matches(g, "\xC3\xA9"));          // é
  EXPECT_TRUE(Matches(g, "\xE4\xB8\x80"));      // 一
  EXPECT_TRUE(Matches(g, "\xF0\x9F\x98\x80"));  // 😀
  EXPECT_FALSE(Matches(g, "B"));
  EXPECT_FALSE(Matches(g, "\xC3\xA8"));  // è
  EXPECT_FALSE(Matches(g, "\xED\xA0\x80"));  // a surrogate
}

TEST(Regex, Basics) {
  Grammar g = Must(CompileRegex("^(a|bc)+[0-9]{2,3}\\.x?$"));
  EXPECT_TRUE(Matches(g, "a12."));
  EXPECT_TRUE(Matches(g, "abcbc999.x"));
  EXPECT_FALSE(Matches(g, "a1."));
  EXPECT_FALSE(Matches(g, "a1234."));
  EXPECT_FALSE(Matches(g, "12."));
  Grammar h = Must(CompileRegex("[^a-c]\\d\\w\\s."));
  EXPECT_TRUE(Matches(h, "d1_ z"));
  EXPECT_FALSE(Matches(h, "a1_ z"));
  EXPECT_FALSE(Matches(h, "d1_ \n"));
}

TEST(Regex, UnsupportedConstructsAreNamed) {
  auto a = CompileRegex("(?=x)y");
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kUnsupported);
  auto b = CompileRegex("(a)\\1");
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("backreference"), std::string::npos);
  auto c = CompileRegex("a{5");
  EXPECT_FALSE(c.ok());
  auto d = CompileRegex("(ab");
  EXPECT_FALSE(d.ok());
}

TEST(Choice, ExactlyOneOf) {
  Grammar g = Must(CompileChoice({"yes", "no", "maybe so"}));
  EXPECT_TRUE(Matches(g, "yes"));
  EXPECT_TRUE(Matches(g, "maybe so"));
  EXPECT_FALSE(Matches(g, "ye"));
  EXPECT_FALSE(Matches(g, "yesno"));
}

TEST(Gbnf, ArithmeticAndComments) {
  const char* text = R"G(# a calculator
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= num | "(" expr ")"
num  ::= [0-9]+   # digits
)G";
  Grammar g = Must(CompileGbnf(text));
  EXPECT_TRUE(Matches(g, "1+(22-3)"));
  EXPECT_FALSE(Matches(g, "1+"));
  EXPECT_FALSE(Matches(g, "(1"));
}

TEST(Gbnf, ClassesEscapesAndBounds) {
  Grammar g = Must(CompileGbnf("root ::= [^\\n\"]{1,3} \"\\x41\" [\\u00e0-\\u00ff]? ."));
  EXPECT_TRUE(Matches(g, "abcAz"));
  EXPECT_TRUE(Matches(g, "aA\xC3\xA9!"));
  EXPECT_FALSE(Matches(g, "abcdAz"));
  EXPECT_FALSE(Matches(g, "\"Az"));
}

TEST(Gbnf, Errors) {
  EXPECT_FALSE(CompileGbnf("root ::= foo").ok());       // undefined rule
  EXPECT_FALSE(CompileGbnf("root ::= \"a").ok());       // unterminated
  EXPECT_FALSE(CompileGbnf("root \"a\"").ok());         // no ::=
  EXPECT_FALSE(CompileGbnf("x ::= \"a\"").ok());        // no root
  EXPECT_FALSE(CompileGbnf("root ::= [b-a]").ok());     // range out of order
}

// Group nesting is bounded (a fuzzer found the regex parser's stack overflow at a few hundred
// levels); 100 levels still compile.
TEST(Grammar, DeeplyNestedGroupsAreAnErrorNotAStackOverflow) {
  auto nest = [](int n, const std::string& inner) {
    return std::string(n, '(') + inner + std::string(n, ')');
  };
  EXPECT_TRUE(CompileRegex(nest(100, "a")).ok());
  auto deep = CompileRegex(nest(2000, "a"));  // patterns are at most 4096 bytes
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.status().message().find("nested deeper than 100"), std::string::npos)
      << deep.status().message();
  EXPECT_TRUE(CompileGbnf("root ::= " + nest(100, "\"a\"")).ok());
  auto gbnf = CompileGbnf("root ::= " + nest(30000, "\"a\""));
  ASSERT_FALSE(gbnf.ok());
  EXPECT_NE(gbnf.status().message().find("nested deeper than 100"), std::string::npos)
      << gbnf.status().message();
}

Grammar Schema(const char* json, bool strict = true) {
  JsonSchemaOptions o;
  o.strict = strict;
  return Must(CompileJsonSchema(nlohmann::json::parse(json), o, nullptr));
}

TEST(JsonSchema, ObjectRequiredAndOptional) {
  Grammar g = Schema(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},
      "c":{"type":"boolean"}},"required":["b"]})");
  EXPECT_TRUE(Matches(g, R"({"b":"x"})"));
  EXPECT_TRUE(Matches(g, R"({"a":-12,"b":"x","c":true})"));
  EXPECT_TRUE(Matches(g, R"({"b":"","c":false})"));
  EXPECT_FALSE(Matches(g, R"({"a":1})"));
  EXPECT_FALSE(Matches(g, R"({})"));
  EXPECT_FALSE(Matches(g, R"({"b":"x",})"));
  EXPECT_FALSE(Matches(g, R"({"a":01,"b":"x"})"));
}

TEST(JsonSchema, StringsEscapesAndLengths) {
  Grammar g = Schema(R"({"type":"string","minLength":2,"maxLength":3})");
  EXPECT_TRUE(Matches(g, R"("ab")"));
  EXPECT_TRUE(Matches(g, R"("a\n\u001f")"));
  EXPECT_TRUE(Matches(g, "\"\xC3\xA9\xE4\xB8\x80\""));  // two characters, five bytes
  EXPECT_FALSE(Matches(g, R"("a")"));
  EXPECT_FALSE(Matches(g, R"("abcd")"));
  EXPECT_FALSE(Matches(g, "\"a\nb\""));  // raw control character
  EXPECT_FALSE(Matches(g, "\"a\xFF\""));  // not UTF-8
}

TEST(JsonSchema, EnumConstAnyOfAndNull) {
  Grammar g = Schema(R"({"anyOf":[{"enum":["red",2,null]},{"const":{"k":[1]}},{"type":["boolean","null"]}]})");
  EXPECT_TRUE(Matches(g, R"("red")"));
  EXPECT_TRUE(Matches(g, "2"));
  EXPECT_TRUE(Matches(g, R"({"k":[1]})"));
  EXPECT_TRUE(Matches(g, "false"));
  EXPECT_FALSE(Matches(g, R"("blue")"));
}

TEST(JsonSchema, RecursiveRefs) {
  Grammar g = Schema(R"({"$ref":"#/$defs/node","$defs":{"node":{"type":"object","properties":{
      "v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}}})");
  EXPECT_TRUE(Matches(g, R"({"kids":[{"kids":[],"v":2},{"v":3}],"v":1})"));
  EXPECT_FALSE(Matches(g, R"({"kids":[{}],"v":1})"));
}

TEST(JsonSchema, ArraysWithBoundsAndPrefixItems) {
  Grammar g = Schema(R"({"type":"array","items":{"type":"number"},"minItems":1,"maxItems":3})");
  EXPECT_TRUE(Matches(g, "[1.5]"));
  EXPECT_TRUE(Matches(g, "[1,2e5,-0.25]"));
  EXPECT_FALSE(Matches(g, "[]"));
  EXPECT_FALSE(Matches(g, "[1,2,3,4]"));
  Grammar t = Schema(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}]})");
  EXPECT_TRUE(Matches(t, R"(["a",1])"));
  EXPECT_FALSE(Matches(t, R"([1,"a"])"));
}

TEST(JsonSchema, IntegerRangesExhaustive) {
  struct Case {
    const char* schema;
    int lo, hi;
  } cases[] = {
      {R"({"type":"integer","minimum":0,"maximum":100})", 0, 100},
      {R"({"type":"integer","minimum":-37,"maximum":251})", -37, 251},
      {R"({"type":"integer","exclusiveMinimum":-5,"exclusiveMaximum":-1})", -4, -2},
      {R"({"type":"integer","minimum":7})", 7, 1000000},
      {R"({"type":"integer","maximum":-13})", -1000000, -13},
      {R"({"type":"integer","minimum":19,"maximum":19})", 19, 19},
  };
  for (const Case& c : cases) {
    Grammar g = Schema(c.schema);
    for (int v = -300; v <= 1200; ++v)
      EXPECT_EQ(Matches(g, std::to_string(v)), v >= c.lo && v <= c.hi) << c.schema << " " << v;
  }
}

TEST(JsonSchema, NumberBounds) {
  Grammar g = Schema(R"({"type":"number","minimum":-2,"maximum":3})");
  for (const char* ok : {"-2", "-2.0", "-1.99", "0", "2.999", "3", "3.000"}) EXPECT_TRUE(Matches(g, ok)) << ok;
  for (const char* bad : {"-2.1", "3.01", "4", "-3", "1e2"}) EXPECT_FALSE(Matches(g, bad)) << bad;
}

TEST(JsonSchema, Formats) {
  Grammar g = Schema(R"({"type":"string","format":"date-time"})");
  EXPECT_TRUE(Matches(g, R"("2024-01-31T23:59:59Z")"));
  EXPECT_TRUE(Matches(g, R"("2024-04-30T00:00:00.5+02:00")"));
  EXPECT_FALSE(Matches(g, R"("2024-02-30T00:00:00Z")"));
  EXPECT_FALSE(Matches(g, R"("2024-04-31T00:00:00Z")"));
  Grammar u = Schema(R"({"type":"string","format":"uuid"})");
  EXPECT_TRUE(Matches(u, R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_FALSE(Matches(u, R"("123e4567e89b12d3a456426614174000")"));
  Grammar p = Schema(R"({"type":"string","pattern":"^[A-Z]{2}-\\d+$"})");
  EXPECT_TRUE(Matches(p, R"("AB-12")"));
  EXPECT_FALSE(Matches(p, R"("Ab-12")"));
}

TEST(JsonSchema, UnsupportedKeywordsAreNamed) {
  for (const char* kw : {"uniqueItems", "contains", "patternProperties", "if", "not", "multipleOf",
                         "minProperties", "maxProperties", "propertyNames", "dependentRequired",
                         "unevaluatedProperties"}) {
    nlohmann::json s = {{"type", "object"}, {kw, true}};
    if (std::string(kw) == "multipleOf") s = {{"type", "integer"}, {kw, 3}};
    if (std::string(kw) == "minProperties" || std::string(kw) == "maxProperties") s[kw] = 1;
    auto g = CompileJsonSchema(s, JsonSchemaOptions{}, nullptr);
    ASSERT_FALSE(g.ok()) << kw;
    EXPECT_EQ(g.status().code(), StatusCode::kUnsupported) << kw;
    EXPECT_NE(g.status().message().find(std::string("'") + kw + "'"), std::string::npos)
        << g.status().message();
    JsonSchemaOptions lenient;
    lenient.strict = false;
    std::vector<std::string> ignored;
    EXPECT_TRUE(CompileJsonSchema(s, lenient, &ignored).ok()) << kw;
    ASSERT_EQ(ignored.size(), 1u) << kw;
    EXPECT_EQ(ignored[0].rfind(kw, 0), 0u);
  }
  auto f = CompileJsonSchema(nlohmann::json::parse(R"({"type":"string","format":"ipv6"})"),
                             JsonSchemaOptions{}, nullptr);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("ipv6"), std::string::npos);
}

TEST(JsonSchema, AnyWhitespaceOption) {
  JsonSchemaOptions o;
  o.any_whitespace = true;
  Grammar g = Must(CompileJsonSchema(nlohmann::json::parse(R"({"type":"object","properties":{
      "a":{"type":"array","items":{"type":"integer"}}},"required":["a"]})"), o, nullptr));
  EXPECT_TRUE(Matches(g, "{ \"a\" : [ 1 ,\n2 ] }"));
  EXPECT_TRUE(Matches(g, R"({"a":[]})"));
}

TEST(JsonObject, AnyObject) {
  Grammar g = Must(CompileJsonObject());
  EXPECT_TRUE(Matches(g, R"({"a":[1,{"b":null}],"c":"d"})"));
  EXPECT_TRUE(Matches(g, "{}"));
  EXPECT_FALSE(Matches(g, "[]"));
  EXPECT_FALSE(Matches(g, "\"x\""));
}

// The trie walk must agree with advancing a copy of the matcher over each token's bytes.
TEST(TokenMask, EqualsBruteForceAndHandlesStraddlingTokens) {
  std::vector<std::string> vocab = {"", "{", "}", "\"", "\"a\"", "\":", "a", "ab", "\":\"", "1", "12",
                                    "true", "tr", ",\"", "\"}", "x", " ", "\"b", "b\":", "\xC3", "\xA9", "\"a", "\",\""};
  auto v = TokenVocab::FromBytes(vocab);
  Grammar g = Schema(R"({"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer"}},
      "required":["a","b"]})");
  auto compiled = std::make_shared<CompiledGrammar>(std::move(g), v);
  TokenMatcher m(compiled);
  GrammarMatcher ref(&compiled->grammar());
  const std::string target = "{\"a\":\"ab\xC3\xA9\",\"b\":12}";
  const std::vector<int32_t> path = {1, 21, 8, 7, 19, 20, 22, 18, 10, 2};  // spells `target`
  std::string spelled;
  for (int32_t id : path) spelled += vocab[id];
  ASSERT_EQ(spelled, target);
  for (int32_t id : path) {
    TokenBitmask mask = m.ComputeMask();
    for (int32_t t = 0; t < v->size(); ++t) {
      const bool expect = !vocab[t].empty() && ref.CanAccept(vocab[t]);
      EXPECT_EQ(TestBit(mask, t), expect) << "token " << t << " before " << id;
    }
    auto cached = m.AllowedTokens();
    EXPECT_EQ(*cached, mask);
    ASSERT_TRUE(m.AcceptToken(id));
    ASSERT_TRUE(ref.AcceptBytes(vocab[id]));
  }
  EXPECT_TRUE(m.IsAccepting());
  EXPECT_FALSE(m.AcceptToken(1));
}

// The automaton walk (ComputeMask), the plain stepping walk and a per-token check agree on every
// token at every position of random walks through several grammars, over a synthetic vocabulary
// rich in tokens that straddle boundaries: closing quotes with the next key, escapes, split UTF-8,
// runs of digits and whitespace.
TEST(TokenMask, AutomatonWalkEqualsSteppingAndBruteForce) {
  std::mt19937 rng(1234);
  const std::string alphabet = "{}[]\":,\\ \n\t0123456789.-+eEabcnrtuflsxyz_u/\xC3\xA9\xE2\x82\xAC\x01";
  std::vector<std::string> vocab = {""};
  for (char c : alphabet) vocab.push_back(std::string(1, c));
  const char* pieces[] = {"\":\"", "\",\"", "\"}", "\"]", "},{", "\": ", ", \"", "true", "false", "null",
                          "\\n", "\\\"", "\\u00", "  ", "    ", "\n  ", "123", "-1", "0.5", "e+", "\"a\"",
                          "ab", "abc", "\xC3\xA9", "\xE2\x82", "\x82\xAC", "\"x\":", "[\"", "\"]}", "{\""};
  for (const char* p : pieces) vocab.push_back(p);
  std::uniform_int_distribution<size_t> pick(0, alphabet.size() - 1);
  std::uniform_int_distribution<int> len(2, 6);
  for (int k = 0; k < 400; ++k) {
    std::string t;
    for (int j = len(rng); j > 0; --j) t.push_back(alphabet[pick(rng)]);
    vocab.push_back(t);
  }
  auto v = TokenVocab::FromBytes(vocab);

  std::vector<Grammar> grammars;
  grammars.push_back(Schema(R"({"type":"object","properties":{"a":{"type":"string"},
      "b":{"type":"array","items":{"type":"number"},"maxItems":3},"c":{"enum":["ab","abc",null,true]}},
      "required":["a","b"]})"));
  grammars.push_back(Schema(R"({"type":"string","minLength":2,"maxLength":5})"));
  grammars.push_back(Schema(R"({"$ref":"#/$defs/n","$defs":{"n":{"type":"object","properties":{
      "x":{"type":"integer","minimum":-5,"maximum":120},"y":{"type":"array","items":{"$ref":"#/$defs/n"}}},
      "required":["x","y"]}}})"));
  grammars.push_back(Must(CompileJsonObject()));
  grammars.push_back(Must(CompileRegex("(ab|a)*c?[0-9]{1,3}")));
  grammars.push_back(Must(CompileGbnf("root ::= \"[\" item (\",\" item)* \"]\"\nitem ::= [a-c]+ | \"\\\"\" [^\"]* \"\\\"\"\n")));
  grammars.push_back(Must(CompileChoice({"abc", "ab", "a\"b", "null"})));
  {
    JsonSchemaOptions ws;
    ws.any_whitespace = true;
    grammars.push_back(Must(CompileJsonSchema(nlohmann::json::parse(
        R"({"type":"object","properties":{"a":{"type":"string"},"n":{"type":"number"}}})"), ws, nullptr)));
  }

  int checked = 0;
  for (size_t gi = 0; gi < grammars.size(); ++gi) {
    auto compiled = std::make_shared<CompiledGrammar>(grammars[gi], v);
    for (int walk = 0; walk < 3; ++walk) {
      TokenMatcher m(compiled);
      GrammarMatcher ref(&compiled->grammar());
      for (int step = 0; step < 40 && !m.IsDone(); ++step) {
        const TokenBitmask mask = m.ComputeMask();
        ASSERT_EQ(mask, m.ComputeMaskStepping()) << "grammar " << gi << " step " << step;
        std::vector<int32_t> allowed;
        for (int32_t t = 0; t < v->size(); ++t) {
          const bool expect = !vocab[t].empty() && ref.CanAccept(vocab[t]);
          ASSERT_EQ(TestBit(mask, t), expect) << "grammar " << gi << " token " << t << " step " << step;
          if (expect) allowed.push_back(t);
          ++checked;
        }
        if (allowed.empty()) break;
        const int32_t id = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
        ASSERT_TRUE(m.AcceptToken(id));
        ASSERT_TRUE(ref.AcceptBytes(vocab[id]));
      }
    }
  }
  EXPECT_GT(checked, 100000);
}

}  // namespace
}  // namespace dh::grammar
