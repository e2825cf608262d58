// Interpreter behaviour beyond the Python-generated cases: error messages, sandbox limits and
// hostile templates (each must end with an error, never a crash or a hang).
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "chat/chat_template.h"

namespace dh::chat {
namespace {

using nlohmann::json;

std::string Render(std::string_view tmpl, const json& ctx = json::object()) {
  auto r = RenderChatTemplate(tmpl, ctx);
  return r.ok() ? *r : "ERROR: " + r.status().message();
}

bool IsError(const std::string& s, std::string_view fragment) {
  return s.rfind("ERROR: ", 0) == 0 && s.find(fragment) != std::string::npos;
}

TEST(Jinja, SyntaxErrorsNameLineColumnAndExpectation) {
  std::string r = Render("ok\n{% if x %}never closed");
  EXPECT_TRUE(IsError(r, "template line 3") || IsError(r, "template line 2")) << r;
  EXPECT_TRUE(IsError(r, "expected '{% elif %}' or '{% else %}' or '{% endif %}'")) << r;
  r = Render("{{ 1 + }}");
  EXPECT_TRUE(IsError(r, "line 1, column 8: expected an expression, got '}}'")) << r;
  r = Render("ab\n  {{ 'unterminated }}");
  EXPECT_TRUE(IsError(r, "line 2, column 6: unterminated string literal")) << r;
  r = Render("{% frobnicate %}");
  EXPECT_TRUE(IsError(r, "unknown statement 'frobnicate'")) << r;
  r = Render("{{ x | nosuchfilter }}");
  EXPECT_TRUE(IsError(r, "unknown filter 'nosuchfilter'")) << r;
  r = Render("{% for x in y %}{% endif %}");
  EXPECT_TRUE(IsError(r, "expected")) << r;
  r = Render("{% break %}");
  EXPECT_TRUE(IsError(r, "outside a for loop")) << r;
}

TEST(Jinja, RuntimeErrors) {
  EXPECT_TRUE(IsError(Render("{{ x.y.z }}"), "'x' is undefined"));
  EXPECT_TRUE(IsError(Render("{{ 1 / 0 }}"), "division by zero"));
  EXPECT_TRUE(IsError(Render("{{ 5 // 0 }}"), "division by zero"));
  EXPECT_TRUE(IsError(Render("{{ 5 % 0 }}"), "division by zero"));
  EXPECT_TRUE(IsError(Render("{{ 9223372036854775807 + 1 }}"), "integer overflow"));
  EXPECT_TRUE(IsError(Render("{{ 2 ** 64 }}"), "integer overflow"));
  EXPECT_TRUE(IsError(Render("{{ 'a' + 1 }}"), "unsupported operand"));
  EXPECT_TRUE(IsError(Render("{{ raise_exception('Only user and assistant roles') }}"),
                      "Only user and assistant roles"));
  EXPECT_TRUE(IsError(Render("{{ 1 < 'a' }}"), "cannot compare"));
  EXPECT_TRUE(IsError(Render("{% set x = 1 %}{% set x.a = 2 %}"), "not a namespace"));
  EXPECT_TRUE(IsError(Render("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}"), "takes 1"));
  EXPECT_TRUE(
      IsError(Render("{{ none | trim }}"), "Cannot apply filter \"trim\" to type: NullValue"));
  EXPECT_TRUE(IsError(Render("\n\n  {{ none | upper }}"), "line 3, column 11"));
}

TEST(Jinja, NoFileOrEnvironmentAccess) {
  for (const char* t : {"{% include '/etc/passwd' %}", "{% import 'x.j2' as x %}",
                        "{% extends 'base' %}", "{% from 'x' import y %}"}) {
    std::string r = Render(t);
    EXPECT_TRUE(IsError(r, "not supported")) << t << " -> " << r;
  }
  // Python object tricks find nothing to escape into.
  EXPECT_EQ(Render("{{ ''.__class__ }}|{{ cycler }}|{{ lipsum }}|{{ self }}"), "|||");
  EXPECT_TRUE(IsError(Render("{{ ''.__class__.__mro__ }}"), "undefined"));
}

TEST(Jinja, UndefinedIsFalsyAndEmpty) {
  EXPECT_EQ(Render("[{{ nope }}][{{ m.nope }}][{{ 'y' if nope else 'n' }}][{{ nope | length }}]",
                   {{"m", json::object()}}),
            "[][][n][0]");
  EXPECT_EQ(Render("{% for x in nope %}x{% else %}none{% endfor %}"), "none");
  EXPECT_EQ(Render("{{ nope is defined }} {{ nope is undefined }}"), "False True");
}

TEST(Jinja, ContextValuesFromJson) {
  json ctx = {
      {"messages", {{{"role", "user"}, {"content", "hi"}}}},
      {"n", 3},
      {"f", 2.5},
      {"flag", true},
      {"nothing", nullptr},
      {"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"z", 1}, {"a", 2}}}}}}};
  EXPECT_EQ(Render("{{ messages[0].role }} {{ n + 1 }} {{ f }} {{ flag }} {{ nothing }}", ctx),
            "user 4 2.5 True None");
  // nlohmann::ordered_json keeps the key order of tool schemas, as Python dicts do.
  auto ordered = nlohmann::ordered_json::parse(R"({"tools": [{"function": {"z": 1, "a": 2}}]})");
  auto r = RenderChatTemplate("{{ tools[0].function | tojson }}", ordered);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, R"({"z": 1, "a": 2})");
}

TEST(Jinja, StrftimeNowFormats) {
  std::string r = Render("{{ strftime_now('%Y') }}");
  ASSERT_EQ(r.size(), 4u) << r;
  EXPECT_GE(std::stoi(r), 2024);
}

TEST(Jinja, HostileTemplatesEndWithErrors) {
  auto start = std::chrono::steady_clock::now();
  // Self-recursive macro.
  EXPECT_TRUE(IsError(Render("{% macro x() %}{{ x() }}{% endmacro %}{{ x() }}"), "nested deeper"));
  // Mutual recursion through the call stack of caller().
  EXPECT_TRUE(IsError(Render("{% macro a(n) %}{{ b(n) }}{% endmacro %}"
                             "{% macro b(n) %}{{ a(n) }}{% endmacro %}{{ a(1) }}"),
                      "nested deeper"));
  // Nested loops: 10^10 iterations if unbounded.
  EXPECT_TRUE(IsError(Render("{% for i in range(100000) %}{% for j in range(100000) %}"
                             "{{ '' }}{% endfor %}{% endfor %}"),
                      "evaluation steps"));
  // Over-large range.
  EXPECT_TRUE(IsError(Render("{% for i in range(1000000000) %}{% endfor %}"), "range()"));
  // Huge string multiplication.
  EXPECT_TRUE(IsError(Render("{{ 'x' * 1000000000 }}"), "over the limit"));
  EXPECT_TRUE(IsError(Render("{{ 'x' * 9223372036854775807 }}"), "over the limit"));
  // Doubling a string in a namespace.
  EXPECT_TRUE(IsError(Render("{% set ns = namespace(s='x') %}{% for i in range(100) %}"
                             "{% set ns.s = ns.s ~ ns.s %}{% endfor %}"),
                      "over the limit"));
  // Output larger than the cap.
  EXPECT_TRUE(IsError(Render("{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}"),
                      "over the limit"));
  // Deep nesting in expressions and blocks.
  std::string parens = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_TRUE(IsError(Render(parens), "nest")) << Render(parens).substr(0, 200);
  std::string lists = "{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}";
  EXPECT_TRUE(IsError(Render(lists), "nest"));
  std::string nots = "{{ " + std::string(0, ' ');
  for (int i = 0; i < 5000; ++i) nots += "not ";
  nots += "1 }}";
  EXPECT_TRUE(IsError(Render(nots), "nest"));
  std::string minus = "{{ " + std::string(5000, '-') + "1 }}";
  EXPECT_TRUE(IsError(Render(minus), "nest"));
  std::string ifs;
  for (int i = 0; i < 5000; ++i) ifs += "{% if true %}";
  EXPECT_TRUE(IsError(Render(ifs), "nest"));
  // Long flat chains build deep trees without deep parser recursion.
  std::string chain = "{{ 1";
  for (int i = 0; i < 100000; ++i) chain += " + 1";
  chain += " }}";
  EXPECT_TRUE(IsError(Render(chain), "nested deeper"));
  std::string filters = "{{ 'a'";
  for (int i = 0; i < 100000; ++i) filters += "|trim";
  filters += " }}";
  EXPECT_TRUE(IsError(Render(filters), "nested deeper"));
  // A namespace that would contain itself is copied, and nesting it is bounded.
  EXPECT_TRUE(IsError(Render("{% set ns = namespace(a=none) %}{% for i in range(1000) %}"
                             "{% set ns.a = [ns] %}{% endfor %}{{ ns }}"),
                      "nested deeper"));
  // Work on long strings is charged by size: indexing, scanning and iterating them.
  EXPECT_TRUE(IsError(Render("{% set ns = namespace(s='x' * 4000000) %}{% for i in range(100000) %}"
                             "{{ ns.s[5] }}{{ ns.s | length }}{{ 'y' in ns.s }}{% endfor %}"),
                      "evaluation steps"));
  EXPECT_TRUE(IsError(Render("{{ ('x' * 4000000) | list | length }}"), "evaluation steps"));
  auto elapsed = std::chrono::steady_clock::now() - start;
  // The bound is for a plain build; ASan and TSan builds run several times slower.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  constexpr int kSlowdown = 4;
#else
  constexpr int kSlowdown = 1;
#endif
  EXPECT_LT(std::chrono::duration_cast<std::chrono::seconds>(elapsed).count(), 20 * kSlowdown);
}

TEST(Jinja, LimitsAreConfigurable) {
  ChatTemplateLimits limits;
  limits.max_steps = 50;
  auto r =
      RenderChatTemplate("{% for i in range(100) %}{{ i }}{% endfor %}", json::object(), limits);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  limits = {};
  limits.max_string_bytes = 10;
  r = RenderChatTemplate("{{ 'abcdefghijk' }}", json::object(), limits);
  EXPECT_FALSE(r.ok());
}

TEST(Jinja, ParseOnceRenderMany) {
  auto t = ChatTemplate::Parse("{% for m in messages %}[{{ m.role }}]{% endfor %}");
  ASSERT_TRUE(t.ok()) << t.status().message();
  for (int i = 0; i < 3; ++i) {
    json ctx = {{"messages", json::array()}};
    for (int k = 0; k <= i; ++k) ctx["messages"].push_back({{"role", "r" + std::to_string(k)}});
    auto r = t->Render(ctx);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->size(), static_cast<size_t>(4 * (i + 1)));
  }
  EXPECT_FALSE(t->Render(json::array()).ok());
}

TEST(Jinja, TokenizerConfigReading) {
  json cfg = {{"bos_token", {{"content", "<s>"}, {"lstrip", false}}},
              {"eos_token", "</s>"},
              {"chat_template", json::array({{{"name", "default"}, {"template", "D"}},
                                             {{"name", "tool_use"}, {"template", "T"}}})}};
  auto c = ChatTemplateFromTokenizerConfig(cfg);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->chat_template, "D");
  EXPECT_EQ(c->bos_token, "<s>");
  EXPECT_EQ(c->eos_token, "</s>");
  auto tool = ChatTemplateFromTokenizerConfig(cfg, "tool_use");
  ASSERT_TRUE(tool.ok());
  EXPECT_EQ(tool->chat_template, "T");
  EXPECT_FALSE(ChatTemplateFromTokenizerConfig(cfg, "missing").ok());
  EXPECT_FALSE(ChatTemplateFromTokenizerConfig(json{{"bos_token", nullptr}}).ok());
  EXPECT_FALSE(ChatTemplateFromTokenizerConfig(json{{"chat_template", 3}}).ok());
}

}  // namespace
}  // namespace dh::chat
