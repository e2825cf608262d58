// Compiled weight cache (`deepharness compile`, docs/compile-cache.md): the public face of
// compile_cache_{key,format,reader,writer}.h; model/load_model.cc decides when to read or write.
// A cache file holds every
// weight exactly as WeightLoader hands it to the kernels (converted, quantized, FP8 scales as f32,
// MLA's absorbed kv_b copies), so a later start reads or maps one file instead of decoding and
// quantizing the checkpoint.
//
// File layout (little-endian, all offsets checked on open):
//   [0, 256)            FileHeader: magic, format version, region offsets, XXH3-128 hashes of
//                       the key, the table and the header itself
//   [4096, ...)         data blobs, each aligned to kCompileCacheAlignment
//   key text            what the file was compiled from (see CompileCacheKey)
//   table               meta (ModelInfo counts), checkpoint tensor names (for Has()), entries:
//                       name, kind, format, rows/cols/block/group sizes and, per tensor slot
//                       (data, scales, zeros, perm, packed), dtype, shape, offset and size
//                       (row slots of a weight stored as its packed copy: dtype, shape only)
// The file is written to a temporary name in the same directory and renamed into place, so a
// reader sees either the old file or the complete new one.
//
// The key covers: the format version, the deepharness build (ELF build id), the backend name and
// its KernelTag() (the CPU backend's SIMD target, tiles and CPU features), the options that change
// weights (the parsed WeightPlan's canonical text),
// config.json's bytes, the index file's bytes, and each *.safetensors file's name, size, mtime
// and header bytes. Tensor data is not hashed (that would read the whole checkpoint at every
// start); a checkpoint rewritten in place with the same size, mtime and header would be missed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"
#include "weights/compile_cache_key.h"
#include "weights/load_options.h"

namespace dh {

// 2: the key records the parsed weight plan ("weights=" + WeightPlan::Canonical()) instead of
// the --dtype/--quant/--quant-lm-head/--policy strings.
// 3: int8 / int4 store f16 scales, int4 4-bit zero points instead of f32 mins (issue 22).
// 4: a fifth tensor slot, the backend's packed copy; a weight it serves alone keeps its rows as
// dtypes and shapes only (the CPU backend's int4 tiles: no repacking at load; issue 22).
inline constexpr uint32_t kCompileCacheVersion = 4;
inline constexpr uint64_t kCompileCacheAlignment = 4096;
inline constexpr char kCompileCacheExtension[] = ".dhc";

std::string_view CompileCacheOutcomeName(CompileCacheResult::Outcome o);

// Checks a cache file without loading a model: header, key (against `expected_key` unless it is
// empty), table bounds and overlaps, and each entry's layout. Reads the header and table only.
// On success returns the number of entries.
Result<size_t> CheckCompileCacheFile(const std::string& path, const std::string& expected_key);

}  // namespace dh
