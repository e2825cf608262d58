// The Tokenizer implementation for Hugging Face tokenizer.json files: added tokens are cut out
// first, the rest is normalized, pre-tokenized and run through BPE; the post-processor adds
// special tokens on request. Internal to src/tokenizer; users go through Tokenizer::Load.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace dh::tok {

class HfTokenizer : public Tokenizer {
 public:
  // `tokenizer_json` is the parsed tokenizer.json; `config_json` the parsed
  // tokenizer_config.json or null. `source` names the directory for error messages.
  static Result<std::unique_ptr<HfTokenizer>> Create(const nlohmann::json& tokenizer_json,
                                                     const nlohmann::json& config_json,
                                                     const std::string& source);

  Result<std::vector<int32_t>> Encode(std::string_view text,
                                      bool add_special_tokens) const override;
  Result<std::string> Decode(std::span<const int32_t> ids, bool skip_special_tokens) const override;
  int32_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> TokenToId(std::string_view token) const override;
  std::optional<std::string> IdToToken(int32_t id) const override;
  bool IsSpecial(int32_t id) const override;
  const TokenizerConfig& config() const override { return config_; }

 private:
  Status LoadAddedTokens(const nlohmann::json& list);
  Status LoadConfig(const nlohmann::json& config, const std::string& source);
  // Normalizes, pre-tokenizes and BPE-encodes one plain-text segment.
  Status EncodePlain(std::string_view text, bool at_input_start, std::vector<int32_t>* ids) const;

  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<PostProcessor> post_processor_;
  std::unique_ptr<Decoder> decoder_;
  std::vector<AddedToken> added_;
  std::unordered_map<int32_t, size_t> added_by_id_;
  TokenMap added_by_content_;
  AddedTokenMatcher raw_matcher_;         // tokens with normalized == false
  AddedTokenMatcher normalized_matcher_;  // tokens with normalized == true
  int32_t vocab_size_ = 0;
  TokenizerConfig config_;
};

}  // namespace dh::tok
