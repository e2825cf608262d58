// Unit tests of the tokenizer stages on small hand-written tokenizer.json documents: BPE
// merges (both forms), byte fallback, ignore_merges, unk, normalizers, pre-tokenizer behaviours,
// decoders, post-processors, added-token flags, config parsing and error reporting.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace dh::tok {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int32_t>;

json CharVocab(const std::string& chars) {
  json vocab = json::object();
  int id = 0;
  for (char c : chars) vocab[std::string(1, c)] = id++;
  return vocab;
}

std::unique_ptr<HfTokenizer> Make(const json& tj, const json& config = nullptr) {
  auto t = HfTokenizer::Create(tj, config, "test");
  EXPECT_TRUE(t.ok()) << t.status().message();
  return t.ok() ? std::move(t).value() : nullptr;
}

Status CreateError(const json& tj, const json& config = nullptr) {
  auto t = HfTokenizer::Create(tj, config, "test");
  return t.ok() ? Status::Ok() : t.status();
}

// vocab a b c ab abc with merges in the string form and the pair form.
json AbcTokenizer(bool pair_merges) {
  json vocab = CharVocab("abc ");
  vocab["ab"] = 4;
  vocab["abc"] = 5;
  json merges = pair_merges ? json::array({json::array({"a", "b"}), json::array({"ab", "c"})})
                            : json::array({"a b", "ab c"});
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
          {"pre_tokenizer", {{"type", "WhitespaceSplit"}}}};
}

TEST(BpeTest, MergesInBothForms) {
  for (bool pairs : {false, true}) {
    auto t = Make(AbcTokenizer(pairs));
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(*t->Encode("abc ab ca", false), (Ids{5, 4, 2, 0}));
  }
}

TEST(BpeTest, RankOrderAndLeftmostTieBreak) {
  // "aaa": merge "a a" applies leftmost first -> [aa, a].
  json tj = {{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"aa", 1}}}, {"merges", {"a a"}}}}};
  auto t = Make(tj);
  EXPECT_EQ(*t->Encode("aaa", false), (Ids{1, 0}));
  EXPECT_EQ(*t->Encode("aaaa", false), (Ids{1, 1}));
}

TEST(BpeTest, LongWordIsFastAndIterative) {
  json tj = {{"model",
              {{"type", "BPE"},
               {"vocab", {{"a", 0}, {"aa", 1}, {"aaaa", 2}}},
               {"merges", {"a a", "aa aa"}}}}};
  auto t = Make(tj);
  const std::string word(200000, 'a');
  auto ids = t->Encode(word, false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->size(), 50000u);
  EXPECT_EQ((*ids)[0], 2);
}

TEST(BpeTest, ByteFallbackAndUnk) {
  json vocab = CharVocab("ab");
  vocab["<unk>"] = 2;
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  json tj = {
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", json::array()},
        {"byte_fallback", true},
        {"unk_token", "<unk>"}}},
      {"decoder",
       {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}}};
  auto t = Make(tj);
  // "é" is C3 A9.
  EXPECT_EQ(*t->Encode("aé", false), (Ids{0, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(*t->Decode(Ids{0, 3 + 0xC3, 3 + 0xA9}, false), "aé");
  // A lone lead byte decodes to U+FFFD.
  EXPECT_EQ(*t->Decode(Ids{3 + 0xC3, 1}, false),
            "\xEF\xBF\xBD"
            "b");

  json no_fallback = tj;
  no_fallback["model"]["byte_fallback"] = false;
  no_fallback["model"]["fuse_unk"] = true;
  auto u = Make(no_fallback);
  EXPECT_EQ(*u->Encode("aééb", false), (Ids{0, 2, 1}));
}

TEST(BpeTest, IgnoreMergesTakesWholeWord) {
  // "abc" is in the vocab but no merge path reaches it.
  json tj = {{"model",
              {{"type", "BPE"},
               {"vocab", {{"a", 0}, {"b", 1}, {"c", 2}, {"abc", 3}}},
               {"merges", json::array()},
               {"ignore_merges", true}}}};
  EXPECT_EQ(*Make(tj)->Encode("abc", false), (Ids{3}));
  tj["model"]["ignore_merges"] = false;
  EXPECT_EQ(*Make(tj)->Encode("abc", false), (Ids{0, 1, 2}));
}

TEST(BpeTest, ContinuingSubwordPrefixAndSuffix) {
  json tj = {{"model",
              {{"type", "BPE"},
               {"vocab", {{"a", 0}, {"##b", 1}, {"a##b", 2}, {"ab", 3}}},
               {"merges", {"a ##b"}},
               {"continuing_subword_prefix", "##"}}}};
  EXPECT_EQ(*Make(tj)->Encode("ab", false), (Ids{3}));
}

TEST(NormalizerTest, SequenceOfNormalizers) {
  json vocab = CharVocab("abcdeX_");
  json tj = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}},
             {"normalizer",
              {{"type", "Sequence"},
               {"normalizers",
                {{{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
                 {{"type", "Lowercase"}},
                 {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "_"}},
                 {{"type", "Prepend"}, {"prepend", "_"}}}}}}};
  auto t = Make(tj);
  EXPECT_EQ(*t->Encode("  AB C  ", false), (Ids{6, 0, 1, 6, 2}));
}

TEST(NormalizerTest, UnicodeForms) {
  std::string s = "e\xCC\x81";  // e + combining acute
  auto nfc = ParseNormalizer({{"type", "NFC"}}, "n");
  ASSERT_TRUE(nfc.ok());
  ASSERT_TRUE((*nfc)->Normalize(&s).ok());
  EXPECT_EQ(s, "\xC3\xA9");
  auto nfd = ParseNormalizer({{"type", "NFD"}}, "n");
  ASSERT_TRUE((*nfd)->Normalize(&s).ok());
  EXPECT_EQ(s, "e\xCC\x81");
  std::string fw = "\xEF\xBC\x91";  // full-width 1
  auto nfkc = ParseNormalizer({{"type", "NFKC"}}, "n");
  ASSERT_TRUE((*nfkc)->Normalize(&fw).ok());
  EXPECT_EQ(fw, "1");
}

std::vector<std::string> Pieces(const json& spec, const std::string& text) {
  auto pre = ParsePreTokenizer(spec, "p");
  EXPECT_TRUE(pre.ok()) << pre.status().message();
  PieceList pieces;
  pieces.text = text;
  pieces.spans.assign(1, {0, text.size()});
  EXPECT_TRUE((*pre)->Apply(&pieces, true).ok());
  std::vector<std::string> out;
  for (const auto& [b, e] : pieces.spans) out.push_back(pieces.text.substr(b, e - b));
  return out;
}

using Strs = std::vector<std::string>;

TEST(PreTokenizerTest, SplitBehaviours) {
  const auto split = [](const char* behavior, bool invert = false) {
    return json{{"type", "Split"},
                {"pattern", {{"String", "-"}}},
                {"behavior", behavior},
                {"invert", invert}};
  };
  const std::string text = "a-b--c";
  EXPECT_EQ(Pieces(split("Removed"), text), (Strs{"a", "b", "c"}));
  EXPECT_EQ(Pieces(split("Isolated"), text), (Strs{"a", "-", "b", "-", "-", "c"}));
  EXPECT_EQ(Pieces(split("MergedWithPrevious"), text), (Strs{"a-", "b-", "-", "c"}));
  EXPECT_EQ(Pieces(split("MergedWithNext"), text), (Strs{"a", "-b", "-", "-c"}));
  EXPECT_EQ(Pieces(split("Contiguous"), text), (Strs{"a", "-", "b", "--", "c"}));
  EXPECT_EQ(Pieces(split("Removed", true), text), (Strs{"-", "-", "-"}));
}

TEST(PreTokenizerTest, RegexWithUnicodeProperties) {
  json spec = {{"type", "Split"},
               {"pattern", {{"Regex", R"(\p{N}{1,3}| ?\p{L}+|\s+(?!\S)|\s+)"}}},
               {"behavior", "Isolated"},
               {"invert", false}};
  EXPECT_EQ(Pieces(spec, "héllo 12345  wörld"), (Strs{"héllo", " ", "123", "45", " ", " wörld"}));
}

TEST(PreTokenizerTest, ByteLevelMapsBytesAndSplits) {
  json spec = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  EXPECT_EQ(Pieces(spec, "Hello world's"), (Strs{"\xC4\xA0Hello", "\xC4\xA0world", "'s"}));
}

TEST(PreTokenizerTest, DigitsPunctuationWhitespaceMetaspace) {
  EXPECT_EQ(Pieces({{"type", "Digits"}, {"individual_digits", true}}, "a12"),
            (Strs{"a", "1", "2"}));
  EXPECT_EQ(Pieces({{"type", "Digits"}, {"individual_digits", false}}, "a12b"),
            (Strs{"a", "12", "b"}));
  EXPECT_EQ(Pieces({{"type", "Punctuation"}}, "hi!?"), (Strs{"hi", "!", "?"}));
  EXPECT_EQ(Pieces({{"type", "Whitespace"}}, "hi, you"), (Strs{"hi", ",", "you"}));
  EXPECT_EQ(Pieces({{"type", "WhitespaceSplit"}}, " a\tb "), (Strs{"a", "b"}));
  EXPECT_EQ(Pieces({{"type", "Metaspace"},
                    {"replacement", "\xE2\x96\x81"},
                    {"prepend_scheme", "always"},
                    {"split", true}},
                   "a b"),
            (Strs{"\xE2\x96\x81"
                  "a",
                  "\xE2\x96\x81"
                  "b"}));
}

TEST(DecoderTest, MetaspaceStripAndReplace) {
  json vocab = {{"\xE2\x96\x81"
                 "a",
                 0},
                {"b", 1},
                {"\xE2\x96\x81"
                 "c",
                 2}};
  json tj = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}},
             {"decoder",
              {{"type", "Sequence"},
               {"decoders",
                {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                 {{"type", "Fuse"}},
                 {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}}};
  EXPECT_EQ(*Make(tj)->Decode(Ids{0, 1, 2}, false), "ab c");
  tj["decoder"] = {
      {"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "always"}};
  EXPECT_EQ(*Make(tj)->Decode(Ids{0, 1, 2}, false), "ab c");
}

json AddedTokensTokenizer() {
  json tj = AbcTokenizer(false);
  tj["added_tokens"] = {{{"id", 10}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
                        {{"id", 11},
                         {"content", "<sep>"},
                         {"special", true},
                         {"normalized", false},
                         {"lstrip", true},
                         {"rstrip", true}},
                        {{"id", 12}, {"content", "<"}, {"special", false}, {"normalized", false}},
                        {{"id", 13},
                         {"content", "cab"},
                         {"special", false},
                         {"normalized", true},
                         {"single_word", true}}};
  tj["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {10}}, {"tokens", {"<s>"}}}}}}};
  return tj;
}

TEST(AddedTokensTest, LongestMatchStripAndSingleWord) {
  auto t = Make(AddedTokensTokenizer());
  EXPECT_EQ(t->vocab_size(), 14);
  // Longest match: "<sep>" beats "<"; lstrip/rstrip swallow the spaces around it.
  EXPECT_EQ(*t->Encode("ab <sep> c<a", false), (Ids{4, 11, 2, 12, 0}));
  // single_word: "cab" only as a whole word.
  EXPECT_EQ(*t->Encode("cab acab", false), (Ids{13, 0, 2, 4}));
  EXPECT_EQ(*t->Encode("ab", true), (Ids{10, 4}));
  EXPECT_EQ(*t->Decode(Ids{10, 4, 11}, true), "ab");
  EXPECT_TRUE(t->IsSpecial(10));
  EXPECT_FALSE(t->IsSpecial(12));
  EXPECT_EQ(t->TokenToId("<sep>"), 11);
  EXPECT_EQ(t->IdToToken(4), "ab");
}

TEST(BadInputTest, InvalidUtf8NamesTheOffset) {
  auto t = Make(AbcTokenizer(false));
  auto r = t->Encode(std::string("ab\xC3(", 4), false);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("byte offset 2"), std::string::npos) << r.status().message();
  EXPECT_FALSE(t->Encode("\xED\xA0\x80", false).ok());  // surrogate
  EXPECT_FALSE(t->Encode("\xC0\x80", false).ok());      // overlong
}

TEST(BadInputTest, DecodeOutOfRange) {
  auto t = Make(AbcTokenizer(false));
  for (int32_t id : {-1, 6, 1 << 30}) {
    auto r = t->Decode(Ids{0, id}, false);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  }
}

TEST(BadInputTest, MalformedTokenizerJsonNamesThePart) {
  json tj = AbcTokenizer(false);
  tj["model"]["merges"] = {"a b c"};
  EXPECT_NE(CreateError(tj).message().find("model.merges[0]"), std::string::npos);
  tj = AbcTokenizer(false);
  tj["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  EXPECT_NE(CreateError(tj).message().find("pre_tokenizer(Split)"), std::string::npos)
      << CreateError(tj).message();
  tj = AbcTokenizer(false);
  tj["decoder"] = {{"type", "NoSuchDecoder"}};
  EXPECT_NE(CreateError(tj).message().find("NoSuchDecoder"), std::string::npos);
  tj = AbcTokenizer(false);
  tj["model"]["merges"] = {"a zz"};
  EXPECT_NE(CreateError(tj).message().find("missing from the vocab"), std::string::npos);
  tj = AbcTokenizer(false);
  tj.erase("model");
  EXPECT_FALSE(CreateError(tj).ok());
}

TEST(ConfigTest, TokensTemplatesAndFlags) {
  json config = {{"bos_token", {{"__type", "AddedToken"}, {"content", "<s>"}}},
                 {"eos_token", "<sep>"},
                 {"pad_token", nullptr},
                 {"add_bos_token", true},
                 {"chat_template",
                  {{{"name", "default"}, {"template", "{{ x }}"}},
                   {{"name", "tool_use"}, {"template", "{{ y }}"}}}}};
  auto t = Make(AddedTokensTokenizer(), config);
  const TokenizerConfig& c = t->config();
  EXPECT_EQ(c.bos_token, "<s>");
  EXPECT_EQ(c.bos_token_id, 10);
  EXPECT_EQ(c.eos_token_id, 11);
  EXPECT_FALSE(c.pad_token.has_value());
  EXPECT_TRUE(c.add_bos_token);
  EXPECT_FALSE(c.add_eos_token);
  EXPECT_EQ(c.chat_templates.at("tool_use"), "{{ y }}");
  config["chat_template"] = "plain";
  EXPECT_EQ(Make(AddedTokensTokenizer(), config)->config().chat_templates.at("default"), "plain");
  config["chat_template"] = 3;
  EXPECT_NE(CreateError(AddedTokensTokenizer(), config).message().find("chat_template"),
            std::string::npos);
}

TEST(Utf8Test, LossyUsesMaximalSubparts) {
  EXPECT_EQ(Utf8Lossy("a\xF0\x9F"
                      "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(Utf8Lossy("\xFF\xFE"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_TRUE(EndsWithIncompleteUtf8("a\xF0\x9F\x98"));
  EXPECT_FALSE(EndsWithIncompleteUtf8("a\xF0\x9F\x98\x80"));
  EXPECT_FALSE(EndsWithIncompleteUtf8("a"));
}

}  // namespace
}  // namespace dh::tok
