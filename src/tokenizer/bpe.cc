// BPE model loading and word merging (see bpe.h). Tie-breaks follow `tokenizers`: the lowest
// merge rank first, then the leftmost position.
#include "tokenizer/bpe.h"

#include <algorithm>
#include <functional>
#include <mutex>

#include "tokenizer/json_fields.h"
#include "tokenizer/utf8.h"

namespace dh::tok {
namespace {
constexpr size_t kCacheMaxEntries = 1 << 18;
constexpr size_t kCacheMaxWordBytes = 256;
constexpr uint64_t kEmptyKey = ~uint64_t{0};  // ids are < 2^31, so no real pair has this key

uint64_t MixKey(uint64_t x) {  // splitmix64 finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

const BpeModel::Merge* BpeModel::FindMerge(int32_t a, int32_t b) const {
  const uint64_t key = PairKey(a, b);
  for (uint64_t slot = MixKey(key) & merge_mask_;; slot = (slot + 1) & merge_mask_) {
    const MergeSlot& s = merge_table_[slot];
    if (s.key == key) return &s.merge;
    if (s.key == kEmptyKey) return nullptr;
  }
}

Result<std::unique_ptr<BpeModel>> BpeModel::Parse(const nlohmann::json& spec,
                                                  const std::string& where) {
  DH_ASSIGN_OR_RETURN(const std::string type, GetStringOr(spec, "type", "BPE", where));
  if (type != "BPE")
    return Unsupported("{}: unsupported model type \"{}\" (only BPE)", where, type);
  if (spec.contains("dropout") && !spec.at("dropout").is_null() &&
      !(spec.at("dropout").is_number() && spec.at("dropout").get<double>() == 0.0)) {
    return Unsupported("{}.dropout: BPE dropout is not supported", where);
  }
  auto model = std::unique_ptr<BpeModel>(new BpeModel());
  if (!spec.contains("vocab") || !spec.at("vocab").is_object()) {
    return InvalidArgument("{}.vocab: expected an object of token -> id", where);
  }
  const auto& vocab = spec.at("vocab");
  model->vocab_.reserve(vocab.size());
  int64_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > INT32_MAX / 2) {
      return InvalidArgument("{}.vocab[\"{}\"]: expected a non-negative id", where, it.key());
    }
    const auto id = it.value().get<int64_t>();
    max_id = std::max(max_id, id);
    model->vocab_.emplace(it.key(), static_cast<int32_t>(id));
  }
  model->id_to_token_.resize(static_cast<size_t>(max_id + 1));
  model->has_token_.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [token, id] : model->vocab_) {
    model->id_to_token_[id] = token;
    model->has_token_[id] = true;
  }

  DH_ASSIGN_OR_RETURN(model->prefix_, GetStringOr(spec, "continuing_subword_prefix", "", where));
  DH_ASSIGN_OR_RETURN(model->suffix_, GetStringOr(spec, "end_of_word_suffix", "", where));
  DH_ASSIGN_OR_RETURN(model->fuse_unk_, GetBoolOr(spec, "fuse_unk", false, where));
  DH_ASSIGN_OR_RETURN(model->byte_fallback_, GetBoolOr(spec, "byte_fallback", false, where));
  DH_ASSIGN_OR_RETURN(model->ignore_merges_, GetBoolOr(spec, "ignore_merges", false, where));
  DH_ASSIGN_OR_RETURN(const std::string unk, GetStringOr(spec, "unk_token", "", where));
  if (!unk.empty()) {
    auto it = model->vocab_.find(unk);
    if (it == model->vocab_.end()) {
      return InvalidArgument("{}.unk_token: \"{}\" is not in the vocab", where, unk);
    }
    model->unk_id_ = it->second;
  }
  model->ascii_ids_.fill(-1);
  for (int ch = 0; ch < 128; ++ch) {
    auto it = model->vocab_.find(std::string(1, static_cast<char>(ch)));
    if (it != model->vocab_.end()) model->ascii_ids_[ch] = it->second;
  }
  if (model->byte_fallback_) {
    model->byte_ids_.assign(256, -1);
    for (int b = 0; b < 256; ++b) {
      auto it = model->vocab_.find(fmt::format("<0x{:02X}>", b));
      if (it != model->vocab_.end()) model->byte_ids_[b] = it->second;
    }
  }

  if (!spec.contains("merges") || !spec.at("merges").is_array()) {
    return InvalidArgument("{}.merges: expected an array", where);
  }
  const auto& merges = spec.at("merges");
  size_t capacity = 16;
  while (capacity < merges.size() * 2) capacity *= 2;
  model->merge_table_.assign(capacity, MergeSlot{});
  model->merge_mask_ = capacity - 1;
  model->new_id_by_rank_.assign(merges.size(), -1);
  std::string left, right;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& m = merges[rank];
    if (m.is_string()) {
      const auto& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return InvalidArgument("{}.merges[{}]: expected \"a b\", got \"{}\"", where, rank, s);
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return InvalidArgument("{}.merges[{}]: expected \"a b\" or [\"a\", \"b\"]", where, rank);
    }
    const auto a = model->vocab_.find(left);
    const auto b = model->vocab_.find(right);
    std::string merged = left;
    std::string_view tail = right;
    if (!model->prefix_.empty() && tail.starts_with(model->prefix_)) {
      tail.remove_prefix(model->prefix_.size());
    }
    merged.append(tail);
    const auto c = model->vocab_.find(merged);
    if (a == model->vocab_.end() || b == model->vocab_.end() || c == model->vocab_.end()) {
      return InvalidArgument("{}.merges[{}]: \"{}\" + \"{}\" uses a token missing from the vocab",
                             where, rank, left, right);
    }
    // The first (lowest-rank) occurrence of a pair wins.
    model->new_id_by_rank_[rank] = c->second;
    const uint64_t key = PairKey(a->second, b->second);
    for (uint64_t slot = MixKey(key) & model->merge_mask_;;
         slot = (slot + 1) & model->merge_mask_) {
      MergeSlot& s = model->merge_table_[slot];
      if (s.key == key) break;
      if (s.key == kEmptyKey) {
        s.key = key;
        s.merge = Merge{static_cast<int32_t>(rank), c->second};
        break;
      }
    }
  }
  return model;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= id_limit() || !has_token_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto it = vocab_.find(word); it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::shared_lock lock(cache_mutex_);
    if (auto it = cache_.find(word); it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = ids->size();
  MergeWord(word, ids);
  if (cacheable) {
    std::unique_lock lock(cache_mutex_);
    if (cache_.size() < kCacheMaxEntries) {
      cache_.emplace(std::string(word), std::vector<int32_t>(ids->begin() + start, ids->end()));
    }
  }
}

void BpeModel::MergeWord(std::string_view word, std::vector<int32_t>* ids) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  std::string piece;
  for (size_t pos = 0; pos < word.size();) {
    const size_t begin = pos;
    NextCodePoint(word, &pos);
    std::string_view ch = word.substr(begin, pos - begin);
    std::optional<int32_t> id;
    if (prefix_.empty() && suffix_.empty()) {
      if (ch.size() == 1) {
        const int32_t ascii = ascii_ids_[static_cast<uint8_t>(ch[0])];
        if (ascii >= 0) id = ascii;
      } else if (auto it = vocab_.find(ch); it != vocab_.end()) {
        id = it->second;
      }
    } else {
      piece.clear();
      if (begin > 0) piece.append(prefix_);
      piece.append(ch);
      if (pos == word.size()) piece.append(suffix_);
      if (auto it = vocab_.find(piece); it != vocab_.end()) id = it->second;
    }
    const auto push = [&](int32_t token) {
      const auto n = static_cast<int32_t>(symbols.size());
      symbols.push_back({token, n - 1, n + 1, true});
    };
    if (id) {
      push(*id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : ch) all = all && byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        for (char c : ch) push(byte_ids_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (unk_id_) {
      if (!(fuse_unk_ && !symbols.empty() && symbols.back().id == *unk_id_)) push(*unk_id_);
    }
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  // Candidates are (rank << 32 | position): the min-heap pops the lowest rank, then the
  // leftmost position. The merge's result comes from new_id_by_rank_.
  std::vector<uint64_t> heap;
  heap.reserve(symbols.size());
  const auto candidate = [&](int32_t pos) -> std::optional<uint64_t> {
    if (pos < 0 || symbols[pos].next < 0) return std::nullopt;
    const Merge* m = FindMerge(symbols[pos].id, symbols[symbols[pos].next].id);
    if (m == nullptr) return std::nullopt;
    return (static_cast<uint64_t>(m->rank) << 32) | static_cast<uint32_t>(pos);
  };
  const auto consider = [&](int32_t pos) {
    if (auto c = candidate(pos)) {
      heap.push_back(*c);
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    }
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) {
    if (auto c = candidate(i)) heap.push_back(*c);
  }
  std::make_heap(heap.begin(), heap.end(), std::greater<>());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const uint64_t top = heap.back();
    heap.pop_back();
    const auto top_pos = static_cast<int32_t>(top & 0xFFFFFFFFu);
    const int32_t new_id = new_id_by_rank_[top >> 32];
    Symbol& left = symbols[top_pos];
    if (!left.alive || left.next < 0) continue;
    const int32_t right_pos = left.next;
    const Merge* m = FindMerge(left.id, symbols[right_pos].id);
    if (m == nullptr || m->new_id != new_id) continue;
    left.id = new_id;
    Symbol& right = symbols[right_pos];
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top_pos;
    consider(left.prev);
    consider(top_pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
}

}  // namespace dh::tok
