// Reference paged causal attention with grouped query heads: one query row at a time, scores in
// f32 with the max subtracted before exp, sums in double; cache elements are read through
// KvGet (dequantized per KvCacheView).
#include <cmath>
#include <limits>
#include <vector>

#include "backend/reference/reference_ops.h"
#include "base/check.h"

namespace dh::ref {

SeqLayout GetSeqLayout(const AttentionMeta& meta, int s) {
  DH_CHECK(s >= 0 && s < meta.num_seqs, "sequence {} of {}", s, meta.num_seqs);
  SeqLayout seq;
  const bool host = !meta.host_query_start.empty();
  if (host) {
    seq.query_start = meta.host_query_start[s];
    seq.query_end = meta.host_query_start[s + 1];
    seq.seq_len = meta.host_seq_lens[s];
    seq.block_table = meta.host_block_tables.data() +
                      static_cast<int64_t>(s) * meta.max_blocks_per_seq;
  } else {
    seq.query_start = GetI32(meta.query_start, s);
    seq.query_end = GetI32(meta.query_start, s + 1);
    seq.seq_len = GetI32(meta.seq_lens, s);
    seq.block_table = meta.block_tables.as<const int32_t>() +
                      static_cast<int64_t>(s) * meta.block_tables.stride[0];
  }
  const int32_t num_queries = seq.query_end - seq.query_start;
  DH_CHECK(num_queries >= 0 && num_queries <= seq.seq_len,
           "sequence {}: {} query rows but {} cached tokens", s, num_queries, seq.seq_len);
  DH_CHECK(seq.seq_len <= static_cast<int64_t>(meta.max_blocks_per_seq) * meta.block_size,
           "sequence {}: length {} exceeds {} blocks of {}", s, seq.seq_len,
           meta.max_blocks_per_seq, meta.block_size);
  return seq;
}

void Attention(const Tensor& q, const KvCacheView& k_cache, const KvCacheView& v_cache,
               const AttentionMeta& meta, float scale, Tensor out) {
  DH_CHECK(q.ndim == 3 && k_cache.data.ndim == 3 && v_cache.data.ndim == 3 && out.ndim == 3,
           "attention wants 3-d q, caches and out");
  const int64_t hq = q.shape[1], dk = q.shape[2];
  const int64_t hkv = k_cache.dim(1), dv = v_cache.dim(2);
  DH_CHECK(hkv > 0 && hq % hkv == 0 && v_cache.dim(1) == hkv && k_cache.dim(2) == dk,
           "attention q {} k_cache {} v_cache {}", q.ShapeString(), k_cache.data.ShapeString(),
           v_cache.data.ShapeString());
  DH_CHECK(out.shape[0] == q.shape[0] && out.shape[1] == hq && out.shape[2] == dv,
           "attention out {} for q {} and v dim {}", out.ShapeString(), q.ShapeString(), dv);
  const int64_t group = hq / hkv;
  std::vector<float> scores;
  std::vector<double> acc(dv);
  for (int s = 0; s < meta.num_seqs; ++s) {
    const SeqLayout seq = GetSeqLayout(meta, s);
    const int32_t num_queries = seq.query_end - seq.query_start;
    for (int32_t t = seq.query_start; t < seq.query_end; ++t) {
      const int64_t pos = seq.seq_len - num_queries + (t - seq.query_start);
      scores.resize(pos + 1);
      for (int64_t h = 0; h < hq; ++h) {
        const int64_t kvh = h / group;
        float max_score = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j <= pos; ++j) {
          const int64_t slot = SlotOf(seq, meta.block_size, j);
          double dot = 0;
          for (int64_t i = 0; i < dk; ++i) {
            dot += static_cast<double>(Get(q, Offset(q, t, h, i))) *
                   KvGet(k_cache, slot, kvh, i);
          }
          scores[j] = static_cast<float>(dot) * scale;
          max_score = std::max(max_score, scores[j]);
        }
        double denom = 0;
        for (int64_t j = 0; j <= pos; ++j) {
          scores[j] = std::exp(scores[j] - max_score);
          denom += scores[j];
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j <= pos; ++j) {
          const int64_t slot = SlotOf(seq, meta.block_size, j);
          for (int64_t i = 0; i < dv; ++i) {
            acc[i] += static_cast<double>(scores[j]) * KvGet(v_cache, slot, kvh, i);
          }
        }
        for (int64_t i = 0; i < dv; ++i) {
          Set(out, Offset(out, t, h, i), static_cast<float>(acc[i] / denom));
        }
      }
    }
  }
}

}  // namespace dh::ref
