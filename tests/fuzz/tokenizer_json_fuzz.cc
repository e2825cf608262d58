// Fuzz target: tokenizer.json loading (model, normalizers, pre-tokenizers with their PCRE2
// patterns, added tokens, post-processor, decoder), then encoding and decoding a sample text.
// An input may append "\n<<<TEXT>>>\n" and the text to encode.
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_target.h"
#include "tokenizer/hf_tokenizer.h"

DH_FUZZ_TARGET(tokenizer_json) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string_view text = "Hello, world! 123 <|im_start|> thé 日本 \n\n  x";
  const std::string_view sep = "\n<<<TEXT>>>\n";
  if (const size_t at = input.find(sep); at != std::string_view::npos) {
    text = input.substr(at + sep.size());
    input = input.substr(0, at);
  }
  const nlohmann::json j = nlohmann::json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  auto tok = dh::tok::HfTokenizer::Create(j, nlohmann::json(), "fuzz");
  if (!tok.ok()) return 0;
  for (bool special : {false, true}) {
    auto ids = (*tok)->Encode(text, special);
    if (ids.ok()) (void)(*tok)->Decode(*ids, !special);
  }
  return 0;
}
