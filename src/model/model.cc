// Batch helpers.
#include "model/model.h"

#include <algorithm>

namespace dh {

void Batch::AddSequence(std::span<const int32_t> ids, int start_pos,
                        std::span<const int32_t> block_table, int block_size, bool all_logits) {
  const int seq = num_seqs();
  if (query_start.empty()) query_start.push_back(0);
  const int first_row = num_tokens();
  for (size_t i = 0; i < ids.size(); ++i) {
    const int pos = start_pos + static_cast<int>(i);
    token_ids.push_back(ids[i]);
    positions.push_back(pos);
    slot_mapping.push_back(block_table[pos / block_size] * block_size + pos % block_size);
    if (all_logits || i + 1 == ids.size()) logits_rows.push_back(first_row + static_cast<int>(i));
  }
  query_start.push_back(num_tokens());
  seq_lens.push_back(start_pos + static_cast<int>(ids.size()));
  // Re-pad every block table to the widest one.
  const int width = std::max(max_blocks_per_seq, static_cast<int>(block_table.size()));
  if (width != max_blocks_per_seq) {
    std::vector<int32_t> padded(static_cast<size_t>(seq) * width, -1);
    for (int s = 0; s < seq; ++s) {
      std::copy_n(block_tables.begin() + static_cast<size_t>(s) * max_blocks_per_seq,
                  max_blocks_per_seq, padded.begin() + static_cast<size_t>(s) * width);
    }
    block_tables = std::move(padded);
    max_blocks_per_seq = width;
  }
  block_tables.insert(block_tables.end(), block_table.begin(), block_table.end());
  block_tables.resize(static_cast<size_t>(seq + 1) * width, -1);
}

}  // namespace dh
