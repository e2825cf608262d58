// Reasoning splitter: whole-text and streaming results agree for every way of cutting the text,
// and templates are classified by whether their generation prompt opens <think>.
#include "chat/reasoning.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "chat/chat_template.h"

namespace dh::chat {
namespace {

TEST(Reasoning, SplitsWholeText) {
  auto r = ParseReasoning("<think>\nLet me think.\n</think>\n\nThe answer is 4.");
  ASSERT_TRUE(r.reasoning_content.has_value());
  EXPECT_EQ(*r.reasoning_content, "\nLet me think.\n");
  ASSERT_TRUE(r.content.has_value());
  EXPECT_EQ(*r.content, "\n\nThe answer is 4.");

  // R1 prompts end with "<think>\n": the output has no opening tag.
  r = ParseReasoning("step 1, step 2</think>42");
  EXPECT_EQ(r.reasoning_content.value_or("?"), "step 1, step 2");
  EXPECT_EQ(r.content.value_or("?"), "42");

  // Truncated thought: everything is reasoning, content is null.
  r = ParseReasoning("still thinking about");
  EXPECT_EQ(r.reasoning_content.value_or("?"), "still thinking about");
  EXPECT_FALSE(r.content.has_value());

  // Empty answer after the thought: content is null.
  r = ParseReasoning("<think>x</think>");
  EXPECT_EQ(r.reasoning_content.value_or("?"), "x");
  EXPECT_FALSE(r.content.has_value());

  // Only the first </think> ends the reasoning.
  r = ParseReasoning("a</think>b</think>c");
  EXPECT_EQ(r.reasoning_content.value_or("?"), "a");
  EXPECT_EQ(r.content.value_or("?"), "b</think>c");
}

TEST(Reasoning, OptionalThinkBlock) {
  ReasoningOptions opt;
  opt.starts_in_reasoning = false;
  auto r = ParseReasoning("Plain answer.", opt);
  EXPECT_FALSE(r.reasoning_content.has_value());
  EXPECT_EQ(r.content.value_or("?"), "Plain answer.");
  r = ParseReasoning("<think>\nhmm\n</think>\n\nAnswer", opt);
  EXPECT_EQ(r.reasoning_content.value_or("?"), "\nhmm\n");
  EXPECT_EQ(r.content.value_or("?"), "\n\nAnswer");
  r = ParseReasoning("<thi", opt);  // a prefix of the tag at the very end is plain text
  EXPECT_FALSE(r.reasoning_content.has_value());
  EXPECT_EQ(r.content.value_or("?"), "<thi");
  r = ParseReasoning("", opt);
  EXPECT_FALSE(r.reasoning_content.has_value());
  EXPECT_FALSE(r.content.has_value());
}

// Every split of the text into two or three pieces gives the same result as the whole text.
void ExpectStreamMatchesWhole(const std::string& text, const ReasoningOptions& opt) {
  ReasoningResult whole = ParseReasoning(text, opt);
  std::string want_reasoning = whole.reasoning_content.value_or("");
  std::string want_content = whole.content.value_or("");
  for (size_t i = 0; i <= text.size(); ++i) {
    for (size_t j = i; j <= text.size(); ++j) {
      ReasoningStreamParser p(opt);
      std::string reasoning, content;
      for (auto piece : {text.substr(0, i), text.substr(i, j - i), text.substr(j)}) {
        ReasoningDelta d = p.Push(piece);
        reasoning += d.reasoning_content;
        content += d.content;
      }
      ReasoningDelta d = p.Finish();
      reasoning += d.reasoning_content;
      content += d.content;
      ASSERT_EQ(reasoning, want_reasoning) << "cuts at " << i << "," << j << " of " << text;
      ASSERT_EQ(content, want_content) << "cuts at " << i << "," << j << " of " << text;
    }
  }
}

TEST(Reasoning, StreamingAgreesWithWholeTextForAnyCuts) {
  for (bool starts_in : {true, false}) {
    ReasoningOptions opt;
    opt.starts_in_reasoning = starts_in;
    for (const char* t :
         {"<think>ab</think>cd", "ab</think>cd", "x</thin", "<think>a</", "a<b</think>",
          "  <think>r</think>c", "no tags at all", "</think>", "<th"}) {
      ExpectStreamMatchesWhole(t, opt);
    }
  }
}

TEST(Reasoning, StreamingHoldsBackOnlyPossibleTags) {
  ReasoningStreamParser p;
  ReasoningDelta d = p.Push("<think>");
  EXPECT_EQ(d.reasoning_content, "");
  d = p.Push("Thinking <b>hard</");
  EXPECT_EQ(d.reasoning_content, "Thinking <b>hard");  // "</" may start "</think>"
  EXPECT_TRUE(p.in_reasoning());
  d = p.Push("b> done</thi");
  EXPECT_EQ(d.reasoning_content, "</b> done");
  d = p.Push("nk>Answer");
  EXPECT_EQ(d.reasoning_content, "");
  EXPECT_EQ(d.content, "Answer");
  EXPECT_FALSE(p.in_reasoning());
  d = p.Push(" more </think>");
  EXPECT_EQ(d.content, " more </think>");
}

TEST(Reasoning, DetectsTemplatesThatOpenThink) {
  auto r1 = ChatTemplate::Parse(
      "{{ bos_token }}{% for m in messages %}<|User|>{{ m.content }}{% endfor %}"
      "{% if add_generation_prompt %}<|Assistant|><think>\n{% endif %}");
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(DetectReasoningStart(*r1), ReasoningStart::kInReasoning);
  auto may = ChatTemplate::Parse(
      "{% for m in messages %}{{ m.content.split('</think>')[-1] }}{% endfor %}"
      "{% if add_generation_prompt %}<|assistant|>\n{% endif %}");
  ASSERT_TRUE(may.ok());
  EXPECT_EQ(DetectReasoningStart(*may), ReasoningStart::kMayOpen);
  auto none = ChatTemplate::Parse("{% for m in messages %}{{ m.content }}{% endfor %}");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(DetectReasoningStart(*none), ReasoningStart::kNone);
  // A closed empty block (Qwen3 with thinking disabled) does not start in reasoning.
  auto closed =
      ChatTemplate::Parse("{% if add_generation_prompt %}A:<think>\n\n</think>\n\n{% endif %}");
  ASSERT_TRUE(closed.ok());
  EXPECT_EQ(DetectReasoningStart(*closed), ReasoningStart::kMayOpen);
}

}  // namespace
}  // namespace dh::chat
