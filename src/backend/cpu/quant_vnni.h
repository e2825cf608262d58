// Integer-dot-product kernels for int8 / int4 weights (backend/weight.h layouts): each row of x
// is quantized on the fly to int8 per block of 32 columns (scale = max|x| / 127, round to
// nearest), and the products run in integer units: vpdpbusd (u8 x s8 -> i32) on zmm with
// AVX512-VNNI, on ymm with AVX-VNNI, or vpmaddubsw + vpmaddwd with AVX2 (quant_int256.h); every
// path computes the same exact i32 lane dots. The Highway kernels of quant_matmul.h (f32
// products) stay the portable path; x86 only, chosen at run time.
//
// Numerics: the weight codes are used exactly; each x element is off by at most half its block's
// scale (max|x| / 254), so an output is off by at most sum over blocks of
// (max|x_block| / 254) * sum |q * scale| (the int4 zero-point term uses exact f32 sums of x),
// plus f32 rounding of the per-lane partial sums. Per lane of 4 (int8) or 8 (int4) columns the i32
// dot is exact and is scaled by x_scale * w_scale in f32.
//
// int8 weights are signed, so for vpdpbusd x is offset by 128 to fit the unsigned operand:
// dot(x + 128, w) - 128 * sum(w), with sum(w) taken by a second vpdpbusd against ones (exact);
// the AVX2 kernel takes x as it is (quant_int256.h).
// int4 codes (0..15) are the unsigned operand against signed x directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "backend/cpu/quant_matmul.h"
#include "base/host_memory.h"
#include "base/thread_pool.h"

namespace dh::cpu {

enum class IntegerDot : uint8_t {
  kAuto,  // integer kernels where the CPU has them and they were measured faster
  kOff,   // always the f32 (Highway) kernels
  kOn,    // integer kernels whenever the CPU and layout allow
};

// The integer kernels, one per x86 tier (quant_int256.h has the 256-bit ones).
enum class IntegerDotPath : uint8_t {
  kNone,     // no integer kernel (non-x86, or a CPU without AVX2)
  kAvx2,     // vpmaddubsw + vpmaddwd on ymm
  kAvxVnni,  // vpdpbusd on ymm (VEX)
  kVnni512,  // vpdpbusd on zmm (AVX512-VNNI)
};

// Overrides the per-call choice (tests and microbenchmarks); kAuto restores it. The starting
// mode comes from the environment variable DH_INTEGER_DOT=on|off|auto|avx2|avxvnni|vnni512
// (default auto; a path name means "on, with that kernel", so an AVX-512 machine runs its AVX2
// path; a path the CPU lacks falls back to the best it has, with a message).
void SetIntegerDotForTest(IntegerDot mode);

// Forces the kernel the integer path uses (kNone: the best the CPU has). A path the CPU lacks is
// ignored (the best is used).
void SetIntegerDotPathForTest(IntegerDotPath path);

// From how many rows of x the integer kernels pack kLanes weight rows side by side and run the
// tiled GEMM (quant_int_dot-inl.h, "Packed tiles") instead of the per-row kernel: 8 when the
// active kernel is vnni512, 32 on the 256-bit ones; layouts whose x blocks of 32 columns do not
// each lie in one weight group always take the per-row kernel. The setter overrides it for
// every kernel (tests and microbenchmarks; 0 restores the defaults).
int64_t PackedMinRows();
// The same over a prepacked weight (a.tiles), where no call packs: 3 rows for int4 (fewer read
// the tiles by rows of x), 5 for int8 on vnni512, else PackedMinRows(); the setter overrides
// both.
int64_t PrepackedMinRows(bool int4);
void SetPackedMinRowsForTest(int64_t rows);

// Whether the CPU has `path`, and the best integer kernel it has.
bool IntegerDotPathAvailable(IntegerDotPath path);
IntegerDotPath BestIntegerDotPath();
// The kernel integer calls use now (the forced one if available, else the best).
IntegerDotPath ActiveIntegerDotPath();
const char* IntegerDotPathName(IntegerDotPath path);

// Whether this CPU and build have any integer kernel (AVX2 at least).
bool IntegerDotAvailable();

// Whether the layout suits the integer kernels: each lane of 4 (int8) / 8 (int4) columns lies in
// one weight group, and a 64-byte vector of codes spans whole groups or part of one group.
bool IntegerDotSupports(bool int4, int64_t k, int64_t group_size);

// The per-call choice (CPU, layout, m, override): true when the integer kernel serves `a`.
bool UseIntegerDot(const QuantMatMulArgs& a);
// The auto policy of UseIntegerDot for a layout the kernels take, on kernel `path` of a CPU
// with (half_width) or without 128-bit vector units (CpuHalfWidthVectorUnits).
bool AutoPrefersIntegerDot(const QuantMatMulArgs& a, IntegerDotPath path, bool half_width);

// Storage on 64-byte boundaries (AllocateHostMemory): the kernels load x's codes and lane scales
// a vector at a time, and from a 16-byte aligned vector every 512-bit load straddles two cache
// lines. Zen 5, in cache (bench_quant --threads 1 --cpu-time 1 --n 512 --mb 1 --m 1, eight
// alternations, quartiles): vnni512 int4 12.5-12.6 -> 12.2-12.3 us, int8 18.9-19.0 -> 18.5-18.6;
// whole-model decode moved within the machine's drift (bench/README.md "Zen 5, session 17").
template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}  // NOLINT: implicit, as rebinding needs
  T* allocate(size_t n) {
    if (n == 0) return nullptr;
    void* p = AllocateHostMemory(n * sizeof(T));
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) { FreeHostMemory(p, n * sizeof(T)); }
  bool operator==(const CacheLineAllocator&) const { return true; }
};
template <typename T>
using LineVector = std::vector<T, CacheLineAllocator<T>>;

// x of one MatMul call, quantized once and shared by all threads. Two layouts:
//  - by rows (the per-row kernels): codes [m][row_bytes], lane_scales [m][lanes],
//    block_scales [m][blocks], group_sums [m][groups];
//  - packed (the packed tiles, from PackedMinRows rows when the layout allows): the rows in
//    quads (the last one padded with zero rows), and per quad and 32-column block the 8 dwords
//    of each of its 4 rows interleaved: codes [quad][block][8][4] dwords, where int8 dword d is
//    columns 4d..4d+3 of the block and int4 dword d = 2 * step + half is the even (half 0) or odd
//    (half 1) columns' codes 8 * step + {0, 2, 4, 6} (+1 for odd); lane_scales [quad][block][4]
//    (one per block, not per lane), group_sums [quad][groups][4]. A kernel then finds the codes
//    of all 4 rows at fixed offsets from one pointer.
struct QuantizedActs {
  int64_t m = 0;
  bool packed = false;
  int64_t row_bytes = 0;  // bytes per x row in `codes` (int4: even half then odd half)
  int64_t lanes = 0;      // i32 lanes per x row (one scale each)
  int64_t groups = 0;     // int4: weight groups per row
  int64_t blocks = 0;     // blocks of 32 columns per row
  // int8 weights: x codes as q itself, for the AVX2 kernel (vpsignb takes x signed: no XOR per
  // row and step to undo the offset); the VNNI kernels' vpdpbusd takes x as q + 128.
  bool int8_signed = false;
  // int8 weights: u8 (q + 128), or s8 q where int8_signed; int4 weights: s8 even | odd.
  LineVector<uint8_t> codes;
  LineVector<float> lane_scales;     // by rows: [m][lanes], the x block scale of each lane
  LineVector<float> group_sums;      // int4: by rows [m][groups], f32 sum of x over each group
  LineVector<float> block_scales;    // by rows: [m][blocks], the scale of each 32-column block
};

// Quantizes a.x (m rows of k) for the integer kernel of a's format and group size, packed when
// PackedTilesSupport(k, group_size) and a.m >= PackedMinRows(), or a.m >= PrepackedMinRows(int4)
// over a prepacked weight (a.tiles), for kernel `path` (kNone: the active one; int8 x codes are
// signed for kAvx2, QuantizedActs::int8_signed). IntegerDotRangeOn takes them on that path only.
// With a pool, the rows of a packed layout are quantized on all its threads.
void QuantizeActs(const QuantMatMulArgs& a, QuantizedActs* acts, ThreadPool* pool = nullptr,
                  IntegerDotPath path = IntegerDotPath::kNone);

// Whether the packed tiles take the layout: every x block of 32 columns inside one weight group.
bool PackedTilesSupport(int64_t k, int64_t group_size);

// ---- Prepacked tiles ----
// An int8 or int4 weight laid out once, at load (CpuBackend::PrepareWeight), the way the packed
// tiles read it (quant_int_dot-inl.h, "Packed tiles"), so no call packs: small batches skip the
// per-call transposes, and every call reads the weight as one stream. Rows in tiles of 16 (the
// last one padded with zero rows), each tile_bytes long:
//   codes   [blocks][steps][16 lanes] dwords: step s of lane i is bytes [4s, 4s + 4) of row
//           16t + i (int8: 4 columns; int4: 8, low nibbles the even ones), zero past the row;
//           4 steps per block of 32 columns for int4, 8 for int8;
//   scales  [groups][16] f16 at scale_offset;
//   int4: zeros [groups][8] bytes at extra_offset, lane i's nibble in byte i / 2 (low first);
//   int8: corr [blocks][16] i32 at extra_offset, -128 * the sum of the block's codes (the VNNI
//         kernels' x holds q + 128; quant_int_dot-inl.h).
// int4 takes the same bytes per weight as the row layout (a tile rounds to 64 bytes), int8
// 1/8 more (the sums). The 256-bit kernels read a tile as two halves of 8 lanes. Every group
// must span whole blocks of 32 columns (PackedTilesSupport).
struct PrepackedLayout {
  int64_t blocks = 0, groups = 0, steps_per_block = 0;
  int64_t scale_offset = 0, extra_offset = 0, tile_bytes = 0;
};
constexpr int64_t kPrepackedRows = 16;
inline PrepackedLayout PrepackedLayoutOf(bool int4, int64_t k, int64_t group_size) {
  PrepackedLayout l;
  const int64_t g = group_size < k ? group_size : k;
  l.blocks = (k + 31) / 32;
  l.groups = (k + g - 1) / g;
  l.steps_per_block = int4 ? 4 : 8;
  l.scale_offset = l.blocks * l.steps_per_block * kPrepackedRows * 4;
  l.extra_offset = l.scale_offset + l.groups * kPrepackedRows * 2;
  const int64_t extra = int4 ? l.groups * kPrepackedRows / 2 : l.blocks * kPrepackedRows * 4;
  l.tile_bytes = (l.extra_offset + extra + 63) / 64 * 64;
  return l;
}
// Whether a layout (format, k, group_size, as QuantMatMulSupports takes it) can be prepacked.
bool PrepackSupports(bool int4, int64_t k, int64_t group_size);
// Whether the backend makes prepacked copies of int4 (int4 = true) or int8 weights with rows of
// k columns (0: any): the integer kernel in use is vnni512 (both formats), or a 256-bit one
// (AVX2, AVX-VNNI) on a CPU with full-width vector units for int8 (held twice, as on vnni512:
// since session 37, when batches of 5-31 rows ran 1.4-1.5x faster over the tiles than through
// the per-row kernel) and for int4 rows of every length (there one or two rows of x read the
// tiles faster than the rows, PrepackedFewRowsInt4, and the rows are released, so the copy
// costs no memory: FewRowsTakeTiles; Zen 1's half-width units were not measured over tiles and
// keep the rows); the integer path was not switched off at start (DH_INTEGER_DOT=off), and
// DH_PREPACKED_TILES is not "off" (the row layout alone: half the memory of int8 weights held in
// RAM, the per-call packing back).
// DH_CPU_TIER=avx2|avxvnni makes the copies a CPU of that tier would make.
bool PrepackWanted(bool int4, int64_t k = 0);
// PrepareWeight carves the copies from shared buffers (backend/buffer_chunks.h), and takes no
// new buffer that would leave less than kPrepackHeadroomBytes of the memory the process may use
// (base/memory_info.h), which the KV cache and the activations still want.
constexpr uint64_t kPrepackHeadroomBytes = uint64_t{4} << 30;
// Bytes the prepacked copy of a weight of n rows takes (0 when it would overflow).
size_t PrepackedBytes(bool int4, int64_t n, int64_t k, int64_t group_size);
// Writes tiles [tile_begin, tile_end) of the weight `a` (int4, q, scales, zeros, k, group_size;
// n rows) to dst, which holds the whole prepacked weight.
void PrepackTiles(const QuantMatMulArgs& a, int64_t n, int64_t tile_begin, int64_t tile_end,
                  uint8_t* dst);
// The inverse: rows [16 * tile_begin, min(n, 16 * tile_end)) of the row layout (codes, f16
// scales and, int4, zero nibbles at a.q / a.scales / a.zeros with their strides, written through
// const_cast) from the tiles at a.tiles. For a weight a compile cache kept as tiles alone, where
// this load needs its rows (CpuBackend::PrepareWeight).
void UnpackTiles(const QuantMatMulArgs& a, int64_t n, int64_t tile_begin, int64_t tile_end);

// Whether the active integer kernel reads a's prepacked tiles for a.m rows of x, so that a range
// must start at a multiple of kPrepackedRows: from PrepackedMinRows rows (x packed), and an int4
// weight's tiles at every number of rows (fewer by rows of x, PrepackedFewRowsInt4) where
// FewRowsTakeTiles or where its rows were released (a.q null), so that its row layout is not
// read once the tiles are made (CpuBackend::PrepareWeight then releases it).
bool ReadsPrepackedTiles(const QuantMatMulArgs& a);
// The longest rows one or two rows of x read from int4 tiles on vnni512. Zen 5, bench_quant
// --threads 2 --m 1 from memory, rows against tiles, three rounds (bench/README.md "Zen 5,
// session 30"): at K = 1408-8192 the tiles ran at 0.88-1.29x the row layout's speed (1536 x 8192
// 188.7-206.4 against 187.3-214.7 us), at K = 8960 the row layout 1.6x faster (1536 x 8960
// 131-154 against 228-255 us; session 44: that is the rows' luck with 8448 and 8960 columns;
// at 9216-18944 columns the tiles ran within ~7 % of the rows).
constexpr int64_t kFewRowsTilesMaxK = 8192;
// Whether one or two rows of x read a weight's prepacked tiles (PrepackedFewRowsInt4) rather
// than its rows on `path`: int4 rows of any length on the 256-bit kernels (AVX2, AVX-VNNI; at
// 1536 x 8960 from memory the tiles ran 1.0-1.2x the rows' speed at one row of x, 1.1-1.4x at
// two and 1.2-1.5x at eight: bench/README.md "Zen 5, session 44"), of up to kFewRowsTilesMaxK
// columns on vnni512. Such a weight's tiles serve every row count, so its rows can go.
constexpr bool FewRowsTakeTiles(IntegerDotPath path, bool int4, int64_t k) {
  return int4 && path != IntegerDotPath::kNone &&
         (path != IntegerDotPath::kVnni512 || k <= kFewRowsTilesMaxK);
}
// Whether rows of x quantized by rows read a's int4 tiles on `path` (PrepackedFewRowsInt4): the
// path takes them at this length, or the rows are gone (a.q null).
inline bool FewRowsReadTiles(IntegerDotPath path, const QuantMatMulArgs& a) {
  return a.tiles != nullptr && a.int4 && path != IntegerDotPath::kNone &&
         (a.q == nullptr || FewRowsTakeTiles(path, a.int4, a.k));
}

// Rows [n_begin, n_end) of the output of `a` with the active integer kernel (needs
// UseIntegerDot(a) or IntegerDotAvailable() && IntegerDotSupports(...)). Packed acts over a
// prepacked weight (a.tiles) take n_begin at a multiple of kPrepackedRows.
void IntegerDotRange(const QuantMatMulArgs& a, const QuantizedActs& acts, int64_t n_begin,
                     int64_t n_end);
// The same on a given kernel (needs IntegerDotPathAvailable(path)).
void IntegerDotRangeOn(IntegerDotPath path, const QuantMatMulArgs& a, const QuantizedActs& acts,
                       int64_t n_begin, int64_t n_end);

// The name --trace-kernels prints for the active integer kernel.
const char* IntegerDotName();

}  // namespace dh::cpu
