// BlockPool: bookkeeping of the paged KV cache — which of a fixed number of blocks (16 slots
// each by default) belongs to which sequence, with reference counts, a prefix cache keyed by
// chained block hashes, and lazy LRU eviction. Pure bookkeeping: no tensors (KvStorage holds the
// memory; slot = block_id * block_size + offset).
//
// Invariants (CheckConsistency verifies them): every block is either used (ref count > 0) or
// free; free blocks are either plain (no hash) or cached-evictable (hashed, in the LRU list);
// free + used == total. A hashed block is the map's value for its hash.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace dh {

// 128-bit chained block hash: Hash(parent, tokens of one full block), keyed per pool with a
// random key so clients cannot aim collisions at another user's prefix; a hit is also verified
// against the stored parent hash and token ids.
struct BlockHash {
  uint64_t hi = 0;
  uint64_t lo = 0;
  bool operator==(const BlockHash& o) const { return hi == o.hi && lo == o.lo; }
};

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const { return static_cast<size_t>(h.lo ^ (h.hi >> 1)); }
};

// The blocks one sequence holds. Blocks [0, num_hashed_blocks) are full and their chain hashes
// are known (last_hash is the hash of block num_hashed_blocks - 1); slots [0, num_slots) are
// reserved for tokens.
struct SequenceBlocks {
  std::vector<int32_t> block_ids;
  int num_slots = 0;
  int num_hashed_blocks = 0;
  BlockHash last_hash;
};

struct BlockPoolStats {
  int total = 0;
  int free = 0;    // plain free + cached-evictable
  int used = 0;    // ref count > 0
  int cached = 0;  // blocks in the prefix cache (used or evictable)
  int evictable = 0;
  int64_t allocated_slots = 0;  // used * block_size
  int64_t wasted_slots = 0;     // reserved-but-unfilled slots in sequences' last blocks
  double fragmentation = 0.0;   // wasted_slots / allocated_slots (0 when nothing is used)
  int64_t prefix_queries = 0;   // tokens looked up in the prefix cache
  int64_t prefix_hits = 0;      // tokens found there
};

class BlockPool {
 public:
  // hash_key 0: a random key.
  BlockPool(int num_blocks, int block_size, bool enable_prefix_caching, uint64_t hash_key = 0);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  bool prefix_caching() const { return prefix_caching_; }
  int num_free_blocks() const { return static_cast<int>(plain_free_.size()) + lru_size_; }
  int ref_count(int32_t block) const { return ref_[block]; }

  // Blocks `seq` must still get to hold num_new_slots more tokens.
  int BlocksNeeded(const SequenceBlocks& seq, int num_new_slots) const;

  // For a sequence holding no blocks: finds the longest run of cached full blocks matching
  // tokens[0, max_tokens), takes a reference on each and gives them to `seq`. Returns the number
  // of tokens covered (a multiple of block_size). Counts tokens.size() queries and the covered
  // tokens as hits. Returns 0 when prefix caching is off.
  int AcquireCachedPrefix(SequenceBlocks& seq, std::span<const int32_t> tokens, int max_tokens);

  // Reserves slots for num_new_slots more tokens, allocating blocks (plain free ones first, then
  // evicting the least recently freed cached block). All or nothing: false and no change when
  // too few blocks are free.
  bool Reserve(SequenceBlocks& seq, int num_new_slots);

  // Registers the full blocks among tokens[0, num_computed) (whose KV has been written) in the
  // prefix cache and extends seq's hash chain. No-op when prefix caching is off.
  void CacheFullBlocks(SequenceBlocks& seq, std::span<const int32_t> tokens, int num_computed);

  // Gives back reserved slots past num_slots (speculative decoding's rejected drafts): num_slots
  // shrinks, blocks left with no reserved slot drop their reference. Only unhashed slots can be
  // given back: num_slots >= num_hashed_blocks * block_size.
  void Truncate(SequenceBlocks& seq, int num_slots);

  // Drops seq's references, last block first (so a sequence's tail is evicted before its
  // shared head); blocks reaching 0 become free, hashed ones stay reusable until evicted.
  // Leaves `seq` empty.
  void Release(SequenceBlocks& seq);

  // Forgets every evictable cached block (they become plain free).
  void ResetPrefixCache();

  BlockPoolStats stats() const;

  // Verifies the invariants above by walking every structure; Internal error naming the first
  // broken one. O(num_blocks); for tests.
  Status CheckConsistency() const;

 private:
  BlockHash HashBlock(const BlockHash& parent, std::span<const int32_t> tokens) const;
  int32_t AllocateBlock();
  void FreeBlock(int32_t block);
  void Unhash(int32_t block);
  void LruPushBack(int32_t block);
  void LruRemove(int32_t block);

  int num_blocks_;
  int block_size_;
  bool prefix_caching_;
  uint64_t key0_, key1_;

  std::vector<int32_t> ref_;
  std::vector<uint8_t> hashed_;
  std::vector<BlockHash> hash_;
  std::vector<BlockHash> parent_hash_;
  std::vector<int32_t> block_tokens_;  // [num_blocks * block_size], valid for hashed blocks
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> cached_;

  std::vector<int32_t> plain_free_;  // stack of free blocks without a hash
  // Intrusive LRU list of free hashed blocks (head = evicted first); -1 terminates.
  std::vector<int32_t> lru_prev_, lru_next_;
  std::vector<uint8_t> in_lru_;
  int32_t lru_head_ = -1, lru_tail_ = -1;
  int lru_size_ = 0;

  int64_t wasted_slots_ = 0;
  int64_t prefix_queries_ = 0;
  int64_t prefix_hits_ = 0;
};

}  // namespace dh
