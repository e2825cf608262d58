// BlockPool: ref-counted blocks, chained-hash prefix cache and lazy LRU eviction (see header).
#include "kvcache/block_pool.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "base/check.h"

namespace dh {
namespace {

// SplitMix64 finalizer: a bijective 64-bit mixer with full avalanche.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t RandomKey() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ Mix(reinterpret_cast<uintptr_t>(&rd));
}

}  // namespace

BlockPool::BlockPool(int num_blocks, int block_size, bool enable_prefix_caching, uint64_t hash_key)
    : num_blocks_(num_blocks), block_size_(block_size), prefix_caching_(enable_prefix_caching) {
  DH_CHECK(num_blocks > 0 && block_size > 0, "pool of {} blocks of {}", num_blocks, block_size);
  const uint64_t key = hash_key != 0 ? hash_key : RandomKey();
  key0_ = Mix(key);
  key1_ = Mix(key ^ 0x5851f42d4c957f2dull);
  ref_.assign(num_blocks, 0);
  hashed_.assign(num_blocks, 0);
  hash_.resize(num_blocks);
  parent_hash_.resize(num_blocks);
  block_tokens_.assign(static_cast<size_t>(num_blocks) * block_size, 0);
  lru_prev_.assign(num_blocks, -1);
  lru_next_.assign(num_blocks, -1);
  in_lru_.assign(num_blocks, 0);
  // Stack: block 0 is handed out first.
  plain_free_.reserve(num_blocks);
  for (int b = num_blocks - 1; b >= 0; --b) plain_free_.push_back(b);
}

BlockHash BlockPool::HashBlock(const BlockHash& parent, std::span<const int32_t> tokens) const {
  // Two independently keyed 64-bit lanes; each token is absorbed with a full mix.
  uint64_t a = Mix(key0_ ^ parent.hi) ^ parent.lo;
  uint64_t b = Mix(key1_ ^ parent.lo) + parent.hi;
  for (int32_t t : tokens) {
    const uint64_t v = static_cast<uint32_t>(t);
    a = Mix(a ^ (v * 0xff51afd7ed558ccdull));
    b = Mix(b + v + 0xc4ceb9fe1a85ec53ull);
  }
  return {Mix(a ^ tokens.size()), Mix(b ^ (a >> 7))};
}

int BlockPool::BlocksNeeded(const SequenceBlocks& seq, int num_new_slots) const {
  const int64_t slots = static_cast<int64_t>(seq.num_slots) + num_new_slots;
  const int64_t blocks = (slots + block_size_ - 1) / block_size_;
  return static_cast<int>(
      std::max<int64_t>(0, blocks - static_cast<int64_t>(seq.block_ids.size())));
}

int BlockPool::AcquireCachedPrefix(SequenceBlocks& seq, std::span<const int32_t> tokens,
                                   int max_tokens) {
  DH_CHECK(seq.block_ids.empty() && seq.num_slots == 0, "prefix lookup on a non-empty sequence");
  if (!prefix_caching_) return 0;
  prefix_queries_ += static_cast<int64_t>(tokens.size());
  const int limit = std::min<int>(max_tokens, static_cast<int>(tokens.size()));
  BlockHash parent;
  int matched = 0;
  while ((matched + 1) * block_size_ <= limit) {
    auto block_tokens = tokens.subspan(static_cast<size_t>(matched) * block_size_, block_size_);
    const BlockHash h = HashBlock(parent, block_tokens);
    auto it = cached_.find(h);
    if (it == cached_.end()) break;
    const int32_t b = it->second;
    const int32_t* stored = &block_tokens_[static_cast<size_t>(b) * block_size_];
    if (!(parent_hash_[b] == parent) ||
        !std::equal(block_tokens.begin(), block_tokens.end(), stored)) {
      break;
    }
    if (ref_[b] == 0) LruRemove(b);
    ++ref_[b];
    seq.block_ids.push_back(b);
    parent = h;
    ++matched;
  }
  seq.num_slots = matched * block_size_;
  seq.num_hashed_blocks = matched;
  seq.last_hash = parent;
  prefix_hits_ += seq.num_slots;
  return seq.num_slots;
}

bool BlockPool::Reserve(SequenceBlocks& seq, int num_new_slots) {
  DH_CHECK(num_new_slots >= 0, "negative reservation {}", num_new_slots);
  const int needed = BlocksNeeded(seq, num_new_slots);
  if (needed > num_free_blocks()) return false;
  for (int i = 0; i < needed; ++i) seq.block_ids.push_back(AllocateBlock());
  wasted_slots_ += static_cast<int64_t>(needed) * block_size_ - num_new_slots;
  seq.num_slots += num_new_slots;
  return true;
}

void BlockPool::CacheFullBlocks(SequenceBlocks& seq, std::span<const int32_t> tokens,
                                int num_computed) {
  if (!prefix_caching_) return;
  DH_CHECK(num_computed <= seq.num_slots && num_computed <= static_cast<int>(tokens.size()),
           "{} computed tokens, {} slots, {} tokens", num_computed, seq.num_slots, tokens.size());
  while ((seq.num_hashed_blocks + 1) * block_size_ <= num_computed) {
    const int i = seq.num_hashed_blocks;
    auto block_tokens = tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
    const BlockHash h = HashBlock(seq.last_hash, block_tokens);
    const int32_t b = seq.block_ids[i];
    if (!hashed_[b] && cached_.find(h) == cached_.end()) {
      // First copy of this content: make it findable. A duplicate computed concurrently by
      // another sequence stays plain and is recycled first when freed.
      hashed_[b] = 1;
      hash_[b] = h;
      parent_hash_[b] = seq.last_hash;
      std::copy(block_tokens.begin(), block_tokens.end(),
                block_tokens_.begin() + static_cast<ptrdiff_t>(b) * block_size_);
      cached_.emplace(h, b);
    }
    seq.last_hash = h;
    ++seq.num_hashed_blocks;
  }
}

void BlockPool::Truncate(SequenceBlocks& seq, int num_slots) {
  DH_CHECK(num_slots >= seq.num_hashed_blocks * block_size_ && num_slots <= seq.num_slots,
           "truncate to {} slots of {} ({} hashed blocks)", num_slots, seq.num_slots,
           seq.num_hashed_blocks);
  const size_t keep = static_cast<size_t>((num_slots + block_size_ - 1) / block_size_);
  wasted_slots_ -= static_cast<int64_t>(seq.block_ids.size()) * block_size_ - seq.num_slots;
  while (seq.block_ids.size() > keep) {
    const int32_t b = seq.block_ids.back();
    seq.block_ids.pop_back();
    DH_CHECK(ref_[b] > 0, "block {} truncated with ref count {}", b, ref_[b]);
    if (--ref_[b] == 0) FreeBlock(b);
  }
  seq.num_slots = num_slots;
  wasted_slots_ += static_cast<int64_t>(seq.block_ids.size()) * block_size_ - seq.num_slots;
}

void BlockPool::Release(SequenceBlocks& seq) {
  wasted_slots_ -= static_cast<int64_t>(seq.block_ids.size()) * block_size_ - seq.num_slots;
  for (auto it = seq.block_ids.rbegin(); it != seq.block_ids.rend(); ++it) {
    const int32_t b = *it;
    DH_CHECK(ref_[b] > 0, "block {} released with ref count {}", b, ref_[b]);
    if (--ref_[b] == 0) FreeBlock(b);
  }
  seq = SequenceBlocks();
}

void BlockPool::ResetPrefixCache() {
  while (lru_head_ >= 0) {
    const int32_t b = lru_head_;
    LruRemove(b);
    Unhash(b);
    plain_free_.push_back(b);
  }
}

int32_t BlockPool::AllocateBlock() {
  int32_t b;
  if (!plain_free_.empty()) {
    b = plain_free_.back();
    plain_free_.pop_back();
  } else {
    DH_CHECK(lru_head_ >= 0, "no free block");
    b = lru_head_;
    LruRemove(b);
    Unhash(b);
  }
  DH_CHECK(ref_[b] == 0 && !hashed_[b], "block {} handed out while in use", b);
  ref_[b] = 1;
  return b;
}

void BlockPool::FreeBlock(int32_t block) {
  if (hashed_[block]) {
    LruPushBack(block);
  } else {
    plain_free_.push_back(block);
  }
}

void BlockPool::Unhash(int32_t block) {
  if (!hashed_[block]) return;
  auto it = cached_.find(hash_[block]);
  DH_CHECK(it != cached_.end() && it->second == block, "block {} missing from the hash map", block);
  cached_.erase(it);
  hashed_[block] = 0;
}

void BlockPool::LruPushBack(int32_t block) {
  DH_CHECK(!in_lru_[block], "block {} freed twice", block);
  in_lru_[block] = 1;
  lru_prev_[block] = lru_tail_;
  lru_next_[block] = -1;
  if (lru_tail_ >= 0) {
    lru_next_[lru_tail_] = block;
  } else {
    lru_head_ = block;
  }
  lru_tail_ = block;
  ++lru_size_;
}

void BlockPool::LruRemove(int32_t block) {
  DH_CHECK(in_lru_[block], "block {} is not evictable", block);
  const int32_t p = lru_prev_[block], n = lru_next_[block];
  if (p >= 0) {
    lru_next_[p] = n;
  } else {
    lru_head_ = n;
  }
  if (n >= 0) {
    lru_prev_[n] = p;
  } else {
    lru_tail_ = p;
  }
  lru_prev_[block] = lru_next_[block] = -1;
  in_lru_[block] = 0;
  --lru_size_;
}

BlockPoolStats BlockPool::stats() const {
  BlockPoolStats s;
  s.total = num_blocks_;
  s.free = num_free_blocks();
  s.used = num_blocks_ - s.free;
  s.cached = static_cast<int>(cached_.size());
  s.evictable = lru_size_;
  s.allocated_slots = static_cast<int64_t>(s.used) * block_size_;
  s.wasted_slots = wasted_slots_;
  s.fragmentation = s.allocated_slots > 0 ? static_cast<double>(wasted_slots_) /
                                                static_cast<double>(s.allocated_slots)
                                          : 0.0;
  s.prefix_queries = prefix_queries_;
  s.prefix_hits = prefix_hits_;
  return s;
}

Status BlockPool::CheckConsistency() const {
  std::vector<uint8_t> in_plain(num_blocks_, 0);
  for (int32_t b : plain_free_) {
    if (b < 0 || b >= num_blocks_ || in_plain[b]) return Internal("plain free list: block {}", b);
    in_plain[b] = 1;
    if (ref_[b] != 0 || hashed_[b] || in_lru_[b]) {
      return Internal("plain free block {} has ref {} hashed {} lru {}", b, ref_[b], hashed_[b],
                      in_lru_[b]);
    }
  }
  int walked = 0;
  int32_t prev = -1;
  for (int32_t b = lru_head_; b >= 0; b = lru_next_[b]) {
    if (++walked > num_blocks_) return Internal("LRU list has a cycle");
    if (!in_lru_[b] || lru_prev_[b] != prev) return Internal("LRU links broken at block {}", b);
    if (ref_[b] != 0 || !hashed_[b]) return Internal("evictable block {} has ref {}", b, ref_[b]);
    prev = b;
  }
  if (prev != lru_tail_ || walked != lru_size_) {
    return Internal("LRU size {} but {} blocks walked", lru_size_, walked);
  }
  int free = 0, used = 0, hashed = 0;
  for (int b = 0; b < num_blocks_; ++b) {
    if (ref_[b] < 0) return Internal("block {} has ref count {}", b, ref_[b]);
    if (ref_[b] > 0) {
      ++used;
      if (in_plain[b] || in_lru_[b]) return Internal("used block {} is on a free list", b);
    } else {
      ++free;
      if (!in_plain[b] && !in_lru_[b]) return Internal("free block {} is on no list", b);
    }
    if (hashed_[b]) {
      ++hashed;
      auto it = cached_.find(hash_[b]);
      if (it == cached_.end() || it->second != b) return Internal("block {} not in hash map", b);
    }
  }
  if (hashed != static_cast<int>(cached_.size())) {
    return Internal("{} hashed blocks but {} map entries", hashed, cached_.size());
  }
  if (free != num_free_blocks() || free + used != num_blocks_) {
    return Internal("free {} (counted {}) + used {} != total {}", num_free_blocks(), free, used,
                    num_blocks_);
  }
  return Status::Ok();
}

}  // namespace dh
