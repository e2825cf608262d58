// Tokenizer::Load (reads the files of a model or tokenizer folder) and StreamingDecoder.
#include "tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/json_util.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/utf8.h"

namespace dh {
namespace {

Result<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("{}: cannot open", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError("{}: read failed", path.string());
  return ss.str();
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path root(dir);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return NotFound("{}: not a directory", dir);
  const fs::path tokenizer_path = root / "tokenizer.json";
  if (!fs::exists(tokenizer_path, ec)) {
    return NotFound("{}: no tokenizer.json (only Hugging Face tokenizer.json files are supported)",
                    dir);
  }
  DH_ASSIGN_OR_RETURN(const std::string tokenizer_text, ReadFile(tokenizer_path));
  DH_ASSIGN_OR_RETURN(const nlohmann::json tokenizer_json,
                      ParseJsonStrict(tokenizer_text, tokenizer_path.string()));
  nlohmann::json config_json;
  const fs::path config_path = root / "tokenizer_config.json";
  if (fs::exists(config_path, ec)) {
    DH_ASSIGN_OR_RETURN(const std::string config_text, ReadFile(config_path));
    DH_ASSIGN_OR_RETURN(config_json, ParseJsonStrict(config_text, config_path.string()));
  }
  DH_ASSIGN_OR_RETURN(auto tokenizer, tok::HfTokenizer::Create(tokenizer_json, config_json, dir));
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

StreamingDecoder::StreamingDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

// Decodes the window ids_[prefix_start_:] and emits what lies past the text already emitted for
// ids_[prefix_start_:read_start_], once it ends in a complete character. Starting the window at
// an earlier token keeps decoder effects tied to the first token (Metaspace's leading-space
// strip) identical in both decodes, so the pieces add up to the one-shot decode.
Result<std::string> StreamingDecoder::Push(int32_t id) {
  if (id < 0 || id >= tokenizer_.vocab_size()) {
    return OutOfRange("stream decode: token id {} is outside the vocabulary [0, {})", id,
                      tokenizer_.vocab_size());
  }
  if (skip_special_tokens_ && tokenizer_.IsSpecial(id)) return std::string();
  ids_.push_back(id);
  const std::span<const int32_t> all(ids_);
  DH_ASSIGN_OR_RETURN(const std::string prefix,
                      tokenizer_.Decode(all.subspan(prefix_start_, read_start_ - prefix_start_),
                                        skip_special_tokens_));
  DH_ASSIGN_OR_RETURN(const std::string full,
                      tokenizer_.Decode(all.subspan(prefix_start_), skip_special_tokens_));
  if (full.size() <= prefix.size() || full.ends_with("\xEF\xBF\xBD") ||
      full.compare(0, prefix.size(), prefix) != 0) {
    return std::string();
  }
  std::string out = full.substr(prefix.size());
  prefix_start_ = read_start_;
  read_start_ = ids_.size();
  emitted_bytes_ += out.size();
  return out;
}

std::string StreamingDecoder::Flush() {
  const std::span<const int32_t> all(ids_);
  auto prefix = tokenizer_.Decode(all.subspan(prefix_start_, read_start_ - prefix_start_),
                                  skip_special_tokens_);
  auto full = tokenizer_.Decode(all.subspan(prefix_start_), skip_special_tokens_);
  std::string out;
  if (prefix.ok() && full.ok() && full->size() > prefix->size()) {
    out = full->substr(prefix->size());
  }
  prefix_start_ = read_start_ = ids_.size();
  emitted_bytes_ += out.size();
  return out;
}

}  // namespace dh
