// Tokenizer: Hugging Face tokenizer.json (+ tokenizer_config.json) loaded and run exactly as the
// `tokenizers` library does: normalizer -> pre-tokenizer -> BPE -> post-processor, with added
// tokens split out first; decoding through the decoder chain. StreamingDecoder emits only
// complete UTF-8.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dh {

struct TokenizerConfig {
  std::optional<std::string> bos_token, eos_token, pad_token, unk_token;
  std::optional<int32_t> bos_token_id, eos_token_id, pad_token_id, unk_token_id;
  bool add_bos_token = false;  // when tokenizer_config.json says so explicitly
  bool add_eos_token = false;
  // "default" plus any named templates ("tool_use", ...). Empty when the files have none.
  std::map<std::string, std::string> chat_templates;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Reads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json.
  static Result<std::unique_ptr<Tokenizer>> Load(const std::string& dir);

  // Invalid UTF-8 in `text` is an InvalidArgument error naming the byte offset.
  virtual Result<std::vector<int32_t>> Encode(std::string_view text,
                                              bool add_special_tokens) const = 0;
  // Ids outside [0, vocab_size()) are an OutOfRange error.
  virtual Result<std::string> Decode(std::span<const int32_t> ids,
                                     bool skip_special_tokens) const = 0;
  virtual int32_t vocab_size() const = 0;  // including added tokens
  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;
  virtual std::optional<std::string> IdToToken(int32_t id) const = 0;
  virtual bool IsSpecial(int32_t id) const = 0;
  virtual const TokenizerConfig& config() const = 0;
};

// Incremental detokenizer: Push returns the text that became final with this token (possibly
// empty while a multi-byte character is incomplete); the concatenation of all pushes plus Flush
// equals Decode of all ids.
class StreamingDecoder {
 public:
  StreamingDecoder(const Tokenizer& tokenizer, bool skip_special_tokens);
  Result<std::string> Push(int32_t id);
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> ids_;
  size_t emitted_bytes_ = 0;
  size_t prefix_start_ = 0;  // first id of the decode window
  size_t read_start_ = 0;    // ids before this one have been emitted
};

}  // namespace dh
