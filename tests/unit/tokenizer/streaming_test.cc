// StreamingDecoder and long-input behaviour on the real tokenizers (skipped without ../shared),
// plus a streaming check on a small byte-fallback tokenizer that always runs.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "unit/tokenizer/real_tokenizers.h"

namespace dh {
namespace {

const std::filesystem::path kTokenizers = testing_util::SharedDir() / "data" / "tokenizers";

const Tokenizer* LoadReal(const std::string& name) { return testing_util::RealTokenizer(name); }

// Streams `ids` and checks each piece is complete UTF-8 and the pieces add up to Decode.
void ExpectStreamMatches(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip,
                         int* empty_pushes) {
  StreamingDecoder stream(t, skip);
  std::string total;
  for (int32_t id : ids) {
    auto piece = stream.Push(id);
    ASSERT_TRUE(piece.ok()) << piece.status().message();
    EXPECT_TRUE(tok::ValidateUtf8(*piece).ok());
    EXPECT_EQ(piece->find("\xEF\xBF\xBD"), std::string::npos) << "partial character emitted";
    if (piece->empty()) ++*empty_pushes;
    total += *piece;
  }
  total += stream.Flush();
  auto once = t.Decode(ids, skip);
  ASSERT_TRUE(once.ok());
  EXPECT_EQ(total, *once);
}

TEST(StreamingDecoderTest, SplitCharactersOnRealTokenizers) {
  for (const char* name : {"deepseek-v3", "qwen3", "llama3.1"}) {
    auto t = LoadReal(name);
    if (t == nullptr) GTEST_SKIP() << "shared tokenizers absent under " << kTokenizers;
    const std::string text =
        "emoji 😀🎉👍🏽 family 👨‍👩‍👧‍👦 CJK 深度求索和华为昇腾 こんにちは 𝄞 "
        "done";
    auto ids = t->Encode(text, true);
    ASSERT_TRUE(ids.ok());
    int empty = 0;
    ExpectStreamMatches(*t, *ids, false, &empty);
    EXPECT_GT(empty, 0) << name << ": expected some tokens to end mid-character";
    // With special tokens in the stream and the skip switch on.
    // Special tokens at the ends and at a character boundary in the middle.
    const auto eos = t->config().eos_token_id;
    ASSERT_TRUE(eos.has_value()) << name;
    std::vector<int32_t> with_special = *ids;
    for (size_t i = with_special.size() / 2; i < with_special.size(); ++i) {
      const std::span<const int32_t> head(with_special.data(), i);
      if (!t->Decode(head, false)->ends_with("\xEF\xBF\xBD")) {
        with_special.insert(with_special.begin() + static_cast<ptrdiff_t>(i), *eos);
        break;
      }
    }
    with_special.insert(with_special.begin(), *eos);
    with_special.push_back(*eos);
    empty = 0;
    ExpectStreamMatches(*t, with_special, true, &empty);
    ExpectStreamMatches(*t, with_special, false, &empty);
    auto skipped = t->Decode(with_special, true);
    EXPECT_EQ(*skipped, *t->Decode(*ids, true));
  }
}

TEST(StreamingDecoderTest, ByteFallbackTokens) {
  nlohmann::json vocab = {{"a", 0}};
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 1 + b;
  nlohmann::json tj = {
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", nlohmann::json::array()},
        {"byte_fallback", true}}},
      {"decoder",
       {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}}};
  auto t = tok::HfTokenizer::Create(tj, nullptr, "test");
  ASSERT_TRUE(t.ok()) << t.status().message();
  auto ids = (*t)->Encode("a😀a中", false);
  ASSERT_TRUE(ids.ok());
  int empty = 0;
  ExpectStreamMatches(**t, *ids, false, &empty);
  EXPECT_EQ(empty, 3 + 2);
  StreamingDecoder stream(**t, false);
  EXPECT_EQ(stream.Push(1000).status().code(), StatusCode::kOutOfRange);
  // A dangling lead byte comes out as U+FFFD at Flush, as in a one-shot decode.
  EXPECT_EQ(*stream.Push(1 + 0xF0), "");
  EXPECT_EQ(stream.Flush(), "\xEF\xBF\xBD");
}

TEST(LongInputTest, NoSpaceMegabyteAndRepeatedChar) {
  auto t = LoadReal("deepseek-v3");
  if (t == nullptr) GTEST_SKIP() << "shared tokenizers absent under " << kTokenizers;
  std::string letters;
  letters.reserve(1 << 20);
  uint32_t x = 12345;
  while (letters.size() < (1u << 20)) {
    x = x * 1103515245u + 12345u;
    letters.push_back(static_cast<char>('a' + (x >> 16) % 26));
  }
  auto ids = t->Encode(letters, false);
  ASSERT_TRUE(ids.ok()) << ids.status().message();
  EXPECT_EQ(*t->Decode(*ids, false), letters);
  const std::string as(1 << 20, 'a');
  auto a_ids = t->Encode(as, false);
  ASSERT_TRUE(a_ids.ok()) << a_ids.status().message();
  EXPECT_EQ(*t->Decode(*a_ids, false), as);
  const std::string spaces(1 << 20, ' ');
  auto s_ids = t->Encode(spaces, false);
  ASSERT_TRUE(s_ids.ok()) << s_ids.status().message();
  EXPECT_EQ(*t->Decode(*s_ids, false), spaces);
}

}  // namespace
}  // namespace dh
