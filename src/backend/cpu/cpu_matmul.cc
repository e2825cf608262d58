// CpuBackend::MatMul as a table of kernels chosen by weight format x path (GEMV for few rows of
// x, tiled GEMM above) x a layout check, and BatchedMatMul (one weight per head) on the same
// GEMV kernel. Every kernel's arguments share one cpu::ActivationArgs.
#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_bf16.h"
#include "backend/cpu/quant_matmul.h"
#include "backend/cpu/quant_vnni.h"
#include "backend/cpu/row_view.h"
#include "backend/kernel_note.h"
#include "backend/reference/reference_ops.h"
#include "base/check.h"
#include "base/host_memory.h"
#include "base/log.h"
#include "base/memory_info.h"

namespace dh {
namespace {

// Which kernel family a MatMul takes by the rows of x: GEMV kernels for up to kGemvMaxRows rows
// (decode), tiled GEMM above (prefill, batches).
enum class MatMulPath : uint8_t { kGemv, kGemm };

// Whether quant_matmul's kernels take weight w: int8 / int4 codes with contiguous rows, f16
// scales laid out [rows, groups] and (int4) packed zero points [rows, ceil(groups / 2)].
bool QuantKernelApplies(const Weight& w) {
  const bool int4 = w.format == WeightFormat::kInt4;
  if (w.format != WeightFormat::kInt8 && !int4) return false;
  if (w.data.dtype != (int4 ? DType::kU8 : DType::kI8)) return false;
  const int64_t groups = (w.cols + w.group_size - 1) / std::max(w.group_size, 1);
  auto rows_of = [&](const Tensor& t, DType dtype, int64_t cols) {
    return t.dtype == dtype && t.ndim == 2 && t.shape[0] == w.rows && t.shape[1] == cols &&
           (t.stride[1] == 1 || t.shape[1] == 1);
  };
  return cpu::QuantMatMulSupports(int4, w.cols, w.group_size) &&
         rows_of(w.scales, DType::kF16, groups) &&
         (!int4 || rows_of(w.zeros, DType::kU8, (groups + 1) / 2));
}

// Whether quant_matmul's FP8 kernels take weight w: e4m3 codes with contiguous rows and f32
// block scales laid out [row blocks, column blocks].
bool Fp8KernelApplies(const Weight& w) {
  if (w.format != WeightFormat::kFp8Block || w.data.dtype != DType::kF8E4M3) return false;
  if (w.block_rows <= 0 || w.block_cols <= 0) return false;
  const Tensor& s = w.scales;
  return s.dtype == DType::kF32 && s.ndim == 2 &&
         s.shape[0] == (w.rows + w.block_rows - 1) / w.block_rows &&
         s.shape[1] == (w.cols + w.block_cols - 1) / w.block_cols &&
         (s.stride[1] == 1 || s.shape[1] == 1);
}

// The tiled GEMM (gemm.h) over the x, bias and out of `a`, n output features: the weight is
// a's dense rows, or the f32 rows rows_fn supplies when it is not null.
cpu::GemmArgs GemmOver(const cpu::MatMulArgs& a, int64_t n, const cpu::WeightRowsFn* rows_fn) {
  cpu::GemmArgs g;
  static_cast<cpu::ActivationArgs&>(g) = a;
  g.n = n;
  if (rows_fn != nullptr) {
    g.rows_fn = rows_fn;
  } else {
    g.w = a.w;
    g.wtype = a.wtype;
    g.w_stride = a.w_stride;
  }
  return g;
}

// One MatMul call's operands, decoded once: the activation rows (ActivationArgs, shared by
// every kernel's arguments) and the weight's layout for each kernel family that accepts it.
struct MatMulCall {
  explicit MatMulCall(const Weight& weight) : w(weight) {}
  const Weight& w;
  cpu::MatMulArgs dense;       // activations; weight fields set for dense weights
  cpu::QuantMatMulArgs quant;  // valid when quant_ok
  cpu::Fp8MatMulArgs fp8;      // valid when fp8_ok
  bool quant_ok = false, fp8_ok = false;
  MatMulPath path = MatMulPath::kGemv;

  int64_t m() const { return dense.m; }
  int64_t n() const { return w.rows; }
  int64_t k() const { return dense.k; }
  // "gemv" for few rows of x, "gemm" for more (the names --trace-kernels prints).
  const char* kind() const { return m() >= 4 ? "gemm" : "gemv"; }

  // Fills the weight side of every argument struct that takes w (dense.x..out_stride are set).
  void Prepare() {
    path = m() > cpu::kGemvMaxRows ? MatMulPath::kGemm : MatMulPath::kGemv;
    if (w.format == WeightFormat::kDense) {
      dense.w = w.data.data;
      dense.wtype = *cpu::WTypeOf(w.data.dtype);
      dense.w_stride = w.data.stride[0];
    }
    quant_ok = QuantKernelApplies(w);
    if (quant_ok) {
      static_cast<cpu::ActivationArgs&>(quant) = dense;
      quant.int4 = w.format == WeightFormat::kInt4;
      // Released rows (PrepareWeight) are left null, so that a kernel reading them fails loudly.
      quant.q = w.rows_released ? nullptr : w.data.data;
      quant.q_stride = w.data.stride[0];
      quant.scales = w.rows_released ? nullptr : w.scales.as<const uint16_t>();
      quant.scale_stride = w.scales.stride[0];
      if (quant.int4) {
        quant.zeros = w.rows_released ? nullptr : w.zeros.as<const uint8_t>();
        quant.zero_stride = w.zeros.stride[0];
        quant.zero_offset = w.zero_offset;
      }
      if (!w.packed.empty()) quant.tiles = w.packed.as<const uint8_t>();
      quant.group_size = w.group_size;
    }
    fp8_ok = Fp8KernelApplies(w);
    if (fp8_ok) {
      static_cast<cpu::ActivationArgs&>(fp8) = dense;
      fp8.q = w.data.as<const uint8_t>();
      fp8.q_stride = w.data.stride[0];
      fp8.scales = w.scales.as<const float>();
      fp8.scale_stride = w.scales.stride[0];
      fp8.block_rows = w.block_rows;
      fp8.block_cols = w.block_cols;
    }
  }

  // Decodes weight rows [j0, j0 + nb) to f32, k floats each: the fused kernels' decoders where
  // they take the layout, else the reference decoder (e.g. non-f32 scales, odd int4 groups).
  void DecodeRows(int64_t j0, int64_t nb, float* rows) const {
    if (quant_ok) {
      cpu::DequantizeRows(quant, j0, nb, rows);
    } else if (fp8_ok) {
      cpu::Fp8DequantizeRows(fp8, j0, nb, rows);
    } else {
      for (int64_t j = 0; j < nb; ++j) ref::DecodeWeightRow(w, j0 + j, rows + j * k());
    }
  }
  // Whether the fused decoders take the columns from col_begin alone (DecodeSlice).
  bool DecodesSlice(int64_t col_begin) const {
    if (quant_ok) return cpu::DequantizeSliceAligned(quant, col_begin);
    return fp8_ok && cpu::Fp8DequantizeSliceAligned(fp8, col_begin);
  }
  // Columns [col_begin, col_begin + col_count) of rows [j0, j0 + nb), col_count floats each
  // (needs DecodesSlice(col_begin)).
  void DecodeSlice(int64_t j0, int64_t nb, int64_t col_begin, int64_t col_count,
                   float* rows) const {
    if (quant_ok) return cpu::DequantizeRows(quant, j0, nb, rows, col_begin, col_count);
    cpu::Fp8DequantizeRows(fp8, j0, nb, rows, col_begin, col_count);
  }
};

// Rows of x from which bf16 weights take the AVX512-BF16 kernels where x is rounded to bf16:
// every call of the GEMM path (gemm_bf16.h; unpacked dot tiles up to 16 rows, the packed GEMM
// beyond). The GEMV's 1-3 rows take the f32 kernel on x rounded here instead: the same products
// (each exact in f32), and one weight stream per thread, which the dot tiles' three rows in flight
// did not match at one row (bench/README.md "Zen 5, session 26").
constexpr int64_t kBf16DotMinRows = cpu::kGemvMaxRows + 1;

// Whether dense weight w (of kernel type wtype) takes x rounded to bf16: bf16, not exact_x, while
// bf16 weights round x (gemm_bf16.h).
bool TakesRoundedX(cpu::WType wtype, const Weight& w) {
  return wtype == cpu::WType::kBF16 && !w.exact_x && cpu::Bf16DotRoundsX();
}

// Columns from which the GEMV's rows of bf16 weights (1-3 rows of x) take the dot tiles too: the
// f32 GEMV holds an x row of 4 * k bytes in L1 beside the weight stream, and from about this
// length it loses to the dot tiles' bf16 x (bench/README.md "Zen 5, session 26": 1536 x 8960 at
// one row 517-541 us against 306-316). Such a weight then takes the dot tiles at every row
// count, so its rows give the same bits alone or in a batch of up to 16.
constexpr int64_t kBf16GemvMaxCols = 4096;

// Whether rows of k columns of weight w (of kernel type wtype) take the dot tiles at 1-3 rows too.
bool LongRowsTakeDotTiles(cpu::WType wtype, const Weight& w, int64_t k) {
  return k > kBf16GemvMaxCols && TakesRoundedX(wtype, w);
}

// Whether a GEMV-path call (1-3 rows) goes to the dot tiles.
bool DotTilesTakeGemv(const MatMulCall& c) {
  return LongRowsTakeDotTiles(c.dense.wtype, c.w, c.k());
}

// Whether this call rounds x to bf16 itself before an f32 kernel (TakesRoundedX, under
// kBf16DotMinRows rows, rows the GEMV keeps). A row's result then does not depend on the rows
// beside it.
bool RoundsXFirst(const MatMulCall& c) {
  return c.m() < kBf16DotMinRows && TakesRoundedX(c.dense.wtype, c.w) && !DotTilesTakeGemv(c);
}

// Points a's x at its rows rounded to bf16 (RoundsXFirst), in this thread's buffer (reused
// across calls; the pool's threads read it through the pointer).
void RoundX(cpu::ActivationArgs* a) {
  thread_local std::vector<float> tl_x;
  tl_x.resize(static_cast<size_t>(a->m * a->k));
  cpu::RoundRowsToBf16(a->x, a->x_stride, a->m, a->k, tl_x.data());
  a->x = tl_x.data();
  a->x_stride = a->k;
}

// The dense GEMM's arguments: x exact for an exact_x weight, or already rounded (RoundsXFirst;
// call RoundX on them then), so the GEMM does not round it (again).
cpu::GemmArgs DenseGemmArgs(const MatMulCall& c) {
  cpu::GemmArgs a = GemmOver(c.dense, c.n(), nullptr);
  a.exact_x = c.w.exact_x || RoundsXFirst(c);
  return a;
}

// The dense GEMM's kernel: the AVX512-BF16 one, the packed panels or the tile (gemm.h).
const char* DenseGemmName(const MatMulCall& c) {
  const cpu::GemmArgs a = DenseGemmArgs(c);
  if (cpu::UseBf16Dot(a)) return "gemm-bf16dot";
  return cpu::GemmUsesPanels(a.m, a.wtype, false) ? "gemm-panels" : "gemm-tiled";
}

// The GEMV path's dense kernel: the dot tiles' GEMM where DotTilesTakeGemv sends the call there.
const char* DenseGemvName(const MatMulCall& c) {
  return DotTilesTakeGemv(c) ? DenseGemmName(c) : c.kind();
}

// Whether DequantGemm's GEMM (f32 rows from a callback) takes the packed panels.
bool DequantGemmPanels(const MatMulCall& c) {
  return cpu::GemmUsesPanels(c.m(), cpu::WType::kF32, true);
}

void DenseGemm(const MatMulCall& c, ThreadPool& pool) {
  cpu::GemmArgs a = DenseGemmArgs(c);
  if (RoundsXFirst(c)) RoundX(&a);
  cpu::Gemm(a, pool);
}

void DenseGemv(const MatMulCall& c, ThreadPool& pool) {
  if (DotTilesTakeGemv(c)) return DenseGemm(c, pool);
  cpu::MatMulArgs a = c.dense;
  if (RoundsXFirst(c)) RoundX(&a);
  pool.ParallelFor(c.n(), cpu::GrainFor(c.m() * c.k()),
                   [&](size_t b, size_t e) { cpu::MatMulRange(a, b, e); });
}

// x quantized to int8 once per call, dot products in VNNI units (quant_vnni.h).
void QuantIntegerDot(const MatMulCall& c, ThreadPool& pool) {
  // This thread's buffers, reused across calls (assign() keeps their capacity). Named through
  // a reference: the pool's threads must read the caller's object, not their own.
  thread_local cpu::QuantizedActs tl_acts;
  cpu::QuantizedActs& acts = tl_acts;
  cpu::QuantizeActs(c.quant, &acts, &pool);
  // Whole packed tiles of 16 weight rows (8 on 256-bit kernels) per chunk.
  if (acts.packed || cpu::ReadsPrepackedTiles(c.quant)) {
    constexpr int64_t kTile = 16;
    const int64_t n = c.n();
    pool.ParallelFor((n + kTile - 1) / kTile, 1, [&](size_t b, size_t e) {
      cpu::IntegerDotRange(c.quant, acts, static_cast<int64_t>(b) * kTile,
                           std::min(n, static_cast<int64_t>(e) * kTile));
    });
    return;
  }
  pool.ParallelFor(c.n(), cpu::GrainFor(c.m() * c.k()),
                   [&](size_t b, size_t e) { cpu::IntegerDotRange(c.quant, acts, b, e); });
}

// int8 / int4 with few rows of x (decode): dequantized in registers (quant_matmul.h).
void QuantGemv(const MatMulCall& c, ThreadPool& pool) {
  pool.ParallelFor(c.n(), cpu::GrainFor(c.m() * c.k()),
                   [&](size_t b, size_t e) { cpu::QuantMatMulRange(c.quant, b, e); });
}

// FP8 blocks with up to Fp8FusedMaxRows rows of x: tiles of weight rows decoded in registers, x
// pre-scaled per block of weight rows (quant_matmul.h).
void Fp8Gemv(const MatMulCall& c, ThreadPool& pool) {
  pool.ParallelFor(c.n(), cpu::GrainFor(c.m() * c.k()),
                   [&](size_t b, size_t e) { cpu::Fp8MatMulRange(c.fp8, b, e); });
}

// FP8 blocks where x is rounded to bf16 (gemm_bf16.h): vdpbf16ps on the codes decoded to bf16,
// tiles up to kFp8DotTileMaxRows rows of x, packed panels beyond.
void Fp8Bf16Dot(const MatMulCall& c, ThreadPool& pool) {
  cpu::Fp8Bf16DotMatMul(c.fp8, c.n(), pool);
}
const char* Fp8Bf16DotName(const MatMulCall& c) {
  if (c.m() > cpu::kFp8DotTileMaxRows) return "gemm-panels-fp8-bf16dot";
  return c.m() >= 4 ? "gemm-fp8-bf16dot" : "gemv-fp8-bf16dot";
}

// Prefill and batches over a non-dense weight: the tiled GEMM (gemm.h) pulls f32 panels through
// a callback. Panels narrower than the row (fewer rows of x than the packed panels take, K over
// kGemmKcMax) decode just their columns where the format allows: every K block starts at a
// multiple of kGemmKcUnit, so groups of 32-256 and FP8's 128-column blocks always do. Decoding
// the whole row per block had cost 9 decodes per row at K = 8960 (int8 batch-8 decode with
// DH_INTEGER_DOT=off: 5.6 -> 12.6 tokens/s; bench/README.md "Zen 1, session 14"); only the rare
// layouts left (other group sizes, formats the reference decoder reads) still do that.
void DequantGemm(const MatMulCall& c, ThreadPool& pool) {
  const int64_t k = c.k();
  const cpu::WeightRowsFn rows_fn = [&](int64_t row_begin, int64_t count, int64_t col_begin,
                                        int64_t col_count, float* dst) {
    if (col_begin == 0 && col_count == k) return c.DecodeRows(row_begin, count, dst);
    if (c.DecodesSlice(col_begin)) {
      return c.DecodeSlice(row_begin, count, col_begin, col_count, dst);
    }
    thread_local std::vector<float> full;
    if (full.size() < static_cast<size_t>(count * k)) full.resize(count * k);
    c.DecodeRows(row_begin, count, full.data());
    for (int64_t j = 0; j < count; ++j) {
      std::copy_n(full.data() + j * k + col_begin, col_count, dst + j * col_count);
    }
  };
  cpu::Gemm(GemmOver(c.dense, c.n(), &rows_fn), pool);
}

// Few rows of x without a fused kernel: dequantize a few rows at a time into a per-chunk f32
// buffer and multiply that.
void DequantGemv(const MatMulCall& c, ThreadPool& pool) {
  constexpr int64_t kRowsPerStep = 8;
  const int64_t k = c.k();
  pool.ParallelFor(c.n(), cpu::GrainFor(c.m() * k), [&](size_t b, size_t e) {
    std::vector<float> rows(kRowsPerStep * k);
    for (int64_t j0 = b; j0 < static_cast<int64_t>(e); j0 += kRowsPerStep) {
      const int64_t nb = std::min<int64_t>(kRowsPerStep, e - j0);
      c.DecodeRows(j0, nb, rows.data());
      cpu::MatMulArgs step = c.dense;
      step.w = rows.data();
      step.wtype = cpu::WType::kF32;
      step.w_stride = k;
      step.out = c.dense.out + j0;
      step.bias = c.dense.bias ? c.dense.bias + j0 : nullptr;
      cpu::MatMulRange(step, 0, nb);
    }
  });
}

constexpr uint32_t FormatBit(WeightFormat f) { return 1u << static_cast<int>(f); }
constexpr uint32_t kDenseOnly = FormatBit(WeightFormat::kDense);
constexpr uint32_t kIntFormats = FormatBit(WeightFormat::kInt8) | FormatBit(WeightFormat::kInt4);
constexpr uint32_t kFp8Only = FormatBit(WeightFormat::kFp8Block);
constexpr uint32_t kNotDense = kIntFormats | kFp8Only;
constexpr uint8_t kAnyPath = 0x3;
constexpr uint8_t PathBit(MatMulPath p) { return static_cast<uint8_t>(1u << static_cast<int>(p)); }

// MatMul's kernels by weight format x path (and the weight's dtype / layout, which `fits`
// checks); the first entry that takes a call runs it. `name` and `variant` name it for the
// tracer (backend/kernel_note.h), `describe` gives the --trace-kernels line.
struct MatMulKernel {
  uint32_t formats;  // FormatBit mask
  uint8_t paths;     // PathBit mask
  bool (*fits)(const MatMulCall&);
  const char* (*name)(const MatMulCall&);
  const char* (*variant)();
  std::string (*describe)(const MatMulCall&);
  void (*run)(const MatMulCall&, ThreadPool&);

  bool Takes(const MatMulCall& c) const {
    return (formats & FormatBit(c.w.format)) != 0 && (paths & PathBit(c.path)) != 0 && fits(c);
  }
};

const MatMulKernel kMatMulKernels[] = {
    {kDenseOnly, PathBit(MatMulPath::kGemm), [](const MatMulCall&) { return true; },
     DenseGemmName, cpu::DispatchedTargetName,
     [](const MatMulCall& c) {
       return fmt::format("matmul {} {}{} M={} N={} K={}", DenseGemmName(c),
                          DTypeName(c.w.data.dtype), RoundsXFirst(c) ? " x-bf16" : "", c.m(),
                          c.n(), c.k());
     },
     DenseGemm},
    {kDenseOnly, PathBit(MatMulPath::kGemv), [](const MatMulCall&) { return true; },
     DenseGemvName, cpu::DispatchedTargetName,
     [](const MatMulCall& c) {
       return fmt::format("matmul {} {}{} M={} N={} K={}", DenseGemvName(c),
                          DTypeName(c.w.data.dtype), RoundsXFirst(c) ? " x-bf16" : "", c.m(),
                          c.n(), c.k());
     },
     DenseGemv},
    {kIntFormats, kAnyPath,
     [](const MatMulCall& c) { return c.quant_ok && cpu::UseIntegerDot(c.quant); },
     [](const MatMulCall& c) { return c.m() >= 4 ? "gemm-int-dot" : "gemv-int-dot"; },
     cpu::IntegerDotName,
     [](const MatMulCall& c) {
       return fmt::format("matmul {} {} g{} {}{} M={} N={} K={}", c.kind(),
                          WeightFormatName(c.w.format), c.w.group_size, cpu::IntegerDotName(),
                          cpu::ReadsPrepackedTiles(c.quant) ? " prepacked-tiles" : "",
                          c.m(), c.n(), c.k());
     },
     QuantIntegerDot},
    {kIntFormats, PathBit(MatMulPath::kGemv), [](const MatMulCall& c) { return c.quant_ok; },
     [](const MatMulCall&) { return "gemv-quant-f32"; }, cpu::DispatchedTargetName,
     [](const MatMulCall& c) {
       return fmt::format("matmul gemv {} g{} f32 M={} N={} K={}", WeightFormatName(c.w.format),
                          c.w.group_size, c.m(), c.n(), c.k());
     },
     QuantGemv},
    {kFp8Only, kAnyPath,
     [](const MatMulCall& c) { return c.fp8_ok && cpu::UseFp8Bf16Dot(c.w.exact_x); },
     Fp8Bf16DotName, cpu::DispatchedTargetName,
     [](const MatMulCall& c) {
       return fmt::format("matmul {} fp8 b{}x{} x-bf16 {} M={} N={} K={}", c.kind(),
                          c.w.block_rows, c.w.block_cols,
                          c.m() <= cpu::kFp8DotTileMaxRows ? "tiles" : "panels", c.m(), c.n(),
                          c.k());
     },
     Fp8Bf16Dot},
    {kFp8Only, kAnyPath,
     [](const MatMulCall& c) { return c.fp8_ok && c.m() <= cpu::Fp8FusedMaxRows(); },
     [](const MatMulCall& c) { return c.m() >= 4 ? "gemm-fp8" : "gemv-fp8"; },
     cpu::DispatchedTargetName,
     [](const MatMulCall& c) {
       return fmt::format("matmul {} fp8 b{}x{} tiles M={} N={} K={}", c.kind(),
                          c.w.block_rows, c.w.block_cols, c.m(), c.n(), c.k());
     },
     Fp8Gemv},
    {kNotDense, PathBit(MatMulPath::kGemm), [](const MatMulCall&) { return true; },
     [](const MatMulCall& c) {
       return DequantGemmPanels(c) ? "gemm-panels-dequant" : "gemm-tiled-dequant";
     },
     cpu::DispatchedTargetName,
     [](const MatMulCall& c) {
       return fmt::format("matmul {} {} dequant{} M={} N={} K={}",
                          DequantGemmPanels(c) ? "gemm-panels" : "gemm-tiled",
                          WeightFormatName(c.w.format), c.fp8_ok ? " f16-decode" : "", c.m(),
                          c.n(), c.k());
     },
     DequantGemm},
    {kNotDense, PathBit(MatMulPath::kGemv), [](const MatMulCall&) { return true; },
     [](const MatMulCall& c) { return c.m() >= 4 ? "gemm-dequant" : "gemv-dequant"; },
     cpu::DispatchedTargetName,
     [](const MatMulCall& c) {
       return fmt::format("matmul {} {} dequant{} M={} N={} K={}", c.kind(),
                          WeightFormatName(c.w.format), c.fp8_ok ? " f16-decode" : "", c.m(),
                          c.n(), c.k());
     },
     DequantGemv},
};

// MatMulOn's operands for x, bias and out in *c (then Prepare): false where the layout sends
// the product to the reference loops (x or out not rows of floats, a bias that is not a plain
// f32 vector, shapes that disagree, a dense type without a kernel).
bool FillCall(const Tensor& x, const Tensor& bias, const Tensor& out, MatMulCall* c) {
  const Weight& w = c->w;
  const auto xr = cpu::AsRows(x), o = cpu::AsRows(out);
  const bool bias_ok =
      bias.empty() || (bias.dtype == DType::kF32 && cpu::IsPlainVector(bias, w.rows));
  const bool dense = w.format == WeightFormat::kDense;
  const bool layout_ok = xr && o && bias_ok && xr->cols == w.cols && o->rows == xr->rows &&
                         o->cols == w.rows && w.data.ndim == 2 &&
                         (w.data.stride[1] == 1 || w.cols == 1);
  if (!layout_ok || (dense && !cpu::WTypeOf(w.data.dtype))) return false;
  cpu::MatMulArgs& a = c->dense;
  a.x = xr->row(0);
  a.x_stride = xr->stride;
  a.m = xr->rows;
  a.k = w.cols;
  a.bias = bias.empty() ? nullptr : bias.as<const float>();
  a.out = o->row(0);
  a.out_stride = o->stride;
  c->Prepare();
  return true;
}

// The first kernel of the table that takes c (the last entries take every format and path).
const MatMulKernel& KernelFor(const MatMulCall& c) {
  for (const MatMulKernel& kernel : kMatMulKernels) {
    if (kernel.Takes(c)) return kernel;
  }
  DH_CHECK(false, "no matmul kernel for {} {}", WeightFormatName(c.w.format),
           DTypeName(c.w.data.dtype));
  return kMatMulKernels[0];
}

// MatMuls: at most this many weights share one x preparation (a layer's q, k and v).
constexpr size_t kMaxSharedX = 4;
// MatMuls hands out output rows in units of this many: whole prepacked tiles (16 rows, 8 on
// 256-bit kernels), so every unit starts where MatMul's own chunks may.
constexpr int64_t kSharedXRows = 16;

// Whether MatMuls may share x over these weights, by their fields alone (checked before any call
// is prepared): int8 or int4 weights of one format and group size, with or without prepacked
// tiles alike (QuantizeActs' inputs), no permutation. Dense weights go one by one: with x rounded
// once and one dispatch, Qwen2-1.5B's bf16 q/k/v and gate/up ran 6-8 % slower in the whole model
// (bench/README.md "Zen 5, session 33"), though not alone in bench_quant.
bool MayShareX(std::span<const MatMulTarget> targets) {
  if (targets.size() < 2 || targets.size() > kMaxSharedX) return false;
  const Weight& first = *targets[0].w;
  if (first.format != WeightFormat::kInt8 && first.format != WeightFormat::kInt4) return false;
  for (const MatMulTarget& t : targets) {
    const Weight& w = *t.w;
    if (w.format != first.format || w.group_size != first.group_size || !w.perm.empty() ||
        w.packed.empty() != first.packed.empty()) {
      return false;
    }
  }
  return true;
}

}  // namespace

bool CpuBackend::TilesServeEveryProduct(const Weight& w, const uint8_t* tiles) const {
  if (w.format != WeightFormat::kInt4 || w.read_by_rows || !options().release_rows) return false;
  MatMulCall c(w);
  c.dense.k = w.cols;
  c.Prepare();
  c.quant.m = 1;
  c.quant.tiles = tiles;
  return cpu::UseIntegerDot(c.quant) && cpu::ReadsPrepackedTiles(c.quant);
}

bool CpuBackend::PackedServesEveryProduct(const Weight& w) const {
  return !w.packed.empty() && TilesServeEveryProduct(w, w.packed.as<const uint8_t>());
}

// The bytes of w's prepacked tiles on this load; 0 where it gets none.
size_t CpuBackend::TileBytes(const Weight& w) const {
  const bool int4 = w.format == WeightFormat::kInt4;
  if (!cpu::PrepackWanted(int4, w.cols) || !QuantKernelApplies(w) ||
      !cpu::PrepackSupports(int4, w.cols, w.group_size)) {
    return 0;
  }
  return cpu::PrepackedBytes(int4, w.rows, w.cols, w.group_size);
}

Result<Weight> CpuBackend::PrepareWeight(const Weight& w) {
  if (!w.packed.empty()) return AdoptTiles(w);
  const size_t bytes = TileBytes(w);
  if (bytes == 0) return w;
  uint8_t* dst = nullptr;
  {
    // Copies are carved from shared buffers (backend/buffer_chunks.h), so they lie in 2 MiB
    // pages even when a weight is smaller (an expert of DeepSeek-V2-Lite: 1.6 MB).
    std::lock_guard<std::mutex> lock(prepacked_mu_);
    // The copies are a speed-up, not a need: a new buffer that would leave less than
    // kPrepackHeadroomBytes of the memory this process may use is not taken, and the weight
    // keeps the row layout alone. Checked per buffer, not per weight (/proc reads at load).
    if (const size_t fresh = prepacked_.NewBufferBytes(bytes); fresh != 0) {
      const MemoryInfo mem = ReadMemoryInfo();
      if (mem.available != 0 && mem.available < fresh + cpu::kPrepackHeadroomBytes) {
        if (!prepack_skipped_.exchange(true)) {
          DH_LOG(Warning, "prepacked tiles: skipped from weight [{}, {}] on: {} left ({}), less "
                 "than a {} buffer + {} headroom (DH_PREPACKED_TILES=off skips them all)",
                 w.rows, w.cols, FormatBytes(mem.available), mem.source, FormatBytes(fresh),
                 FormatBytes(cpu::kPrepackHeadroomBytes));
        }
        return w;
      }
    }
    dst = static_cast<uint8_t*>(prepacked_.Take(*this, bytes));
    if (dst == nullptr) {
      return ResourceExhausted("no memory for the prepacked copy of a {} weight ({} bytes)",
                               WeightFormatName(w.format), bytes);
    }
  }
  MatMulCall c(w);
  c.dense.k = w.cols;
  c.Prepare();
  const int64_t tiles = (w.rows + cpu::kPrepackedRows - 1) / cpu::kPrepackedRows;
  pool_->ParallelFor(static_cast<size_t>(tiles), 1, [&](size_t b, size_t e) {
    cpu::PrepackTiles(c.quant, w.rows, static_cast<int64_t>(b), static_cast<int64_t>(e), dst);
  });
  tiles_packed_bytes_ += bytes;
  Weight out = w;
  out.packed = Tensor(dst, DType::kU8, {static_cast<int64_t>(bytes)});
  return ReleaseServedRows(std::move(out));
}

// An int4 weight's tiles serve every number of rows of x (ReadsPrepackedTiles: every row length
// on the 256-bit kernels, up to kFewRowsTilesMaxK on vnni512), so its row layout goes back to
// the system where this process owns it (the loader's buffers, a compile cache read into memory;
// not a mapped file, nor a caller's memory): the weight is held once, not twice
// (DeepSeek-V2-Lite at int4: 17.8 -> 9.6 GiB of anonymous memory; bench/README.md "Zen 5,
// session 30"). A table also read by rows (an embedding) keeps them, as do int8 (its tiles were
// 1.5x slower than its rows from one row of x) and longer int4 rows on vnni512, and so does
// every weight while the integer path is switched off (tests switch it at run time;
// DH_INTEGER_DOT=off at start makes no tiles) or when the backend was told to keep them
// (BackendOptions::release_rows); a hold (HoldReleases) releases them later.
Weight CpuBackend::ReleaseServedRows(Weight w) {
  if (!TilesServeEveryProduct(w, w.packed.as<const uint8_t>())) return w;
  std::lock_guard<std::mutex> lock(prepacked_mu_);
  for (const Tensor* t : {&w.data, &w.scales, &w.zeros}) {
    if (hold_releases_) {
      held_rows_.push_back({t->data, t->nbytes()});
    } else {
      ReleaseHostPages(t->data, t->nbytes());
    }
  }
  w.rows_released = !hold_releases_;
  return w;
}

// A weight with tiles from a compile cache (made by this build for this CPU: the key holds
// KernelTag). Kept as it is where its tiles serve every product; rows that arrived are handed
// back as above; rows kept as shapes only in the file (rows_released) are rebuilt from the tiles
// where this load reads them (a hold for the self-check, a table, release_rows off).
Result<Weight> CpuBackend::AdoptTiles(const Weight& w) {
  const size_t want = TileBytes(w);
  if (want == 0 || w.packed.dtype != DType::kU8 || w.packed.ndim != 1 ||
      w.packed.nbytes() != want || reinterpret_cast<uintptr_t>(w.packed.data) % 64 != 0) {
    return InvalidArgument("a {} weight [{}, {}] arrived with {} bytes of tiles, where this "
                           "build's tiles take {}", WeightFormatName(w.format), w.rows, w.cols,
                           w.packed.nbytes(), want);
  }
  if (!w.rows_released) return ReleaseServedRows(w);
  {
    std::lock_guard<std::mutex> lock(prepacked_mu_);
    if (!hold_releases_ && TilesServeEveryProduct(w, w.packed.as<const uint8_t>())) return w;
  }
  Weight out = w;
  out.rows_released = false;
  const size_t data_bytes = w.data.nbytes(), scale_bytes = w.scales.nbytes(),
               zero_bytes = w.zeros.nbytes();
  const size_t a1 = (data_bytes + 63) / 64 * 64, a2 = a1 + (scale_bytes + 63) / 64 * 64;
  uint8_t* rows = nullptr;
  {
    std::lock_guard<std::mutex> lock(prepacked_mu_);
    rows = static_cast<uint8_t*>(prepacked_.Take(*this, a2 + zero_bytes));
  }
  if (rows == nullptr) {
    return ResourceExhausted("no memory to rebuild the rows of a {} weight ({} bytes)",
                             WeightFormatName(w.format), a2 + zero_bytes);
  }
  out.data.data = rows;
  out.scales.data = rows + a1;
  if (!w.zeros.empty()) out.zeros.data = rows + a2;
  MatMulCall c(out);
  c.dense.k = w.cols;
  c.Prepare();
  c.quant.tiles = w.packed.as<const uint8_t>();
  const int64_t tiles = (w.rows + cpu::kPrepackedRows - 1) / cpu::kPrepackedRows;
  pool_->ParallelFor(static_cast<size_t>(tiles), 1, [&](size_t b, size_t e) {
    cpu::UnpackTiles(c.quant, w.rows, static_cast<int64_t>(b), static_cast<int64_t>(e));
  });
  return ReleaseServedRows(std::move(out));
}

void CpuBackend::HoldReleases() {
  std::lock_guard<std::mutex> lock(prepacked_mu_);
  hold_releases_ = true;
}

void CpuBackend::ReleaseHeldRows() {
  std::lock_guard<std::mutex> lock(prepacked_mu_);
  for (const auto& [data, bytes] : held_rows_) ReleaseHostPages(data, bytes);
  held_rows_.clear();
  held_rows_.shrink_to_fit();
  hold_releases_ = false;
}

void CpuBackend::MatMul(const Tensor& x, const Weight& w, const Tensor& bias, Tensor out) {
  MatMulOn(*pool_, x, w, bias, out);
}

void CpuBackend::MatMulOn(ThreadPool& pool, const Tensor& x, const Weight& w, const Tensor& bias,
                          Tensor out) {
  if (!w.perm.empty()) {
    // Input permutation (GPTQ act-order): gather x[:, perm] into a scratch buffer, then multiply
    // by the same weight without the permutation.
    const auto xp = cpu::AsRows(x);
    const bool perm_ok = w.perm.dtype == DType::kI32 && w.perm.ndim == 1 &&
                         w.perm.shape[0] == w.cols && (w.perm.stride[0] == 1 || w.cols == 1);
    if (!xp || !perm_ok || xp->cols != w.cols) {
      Trace("matmul reference permuted {}", WeightFormatName(w.format));
      return ReferenceBackend::MatMul(x, w, bias, out);
    }
    const int64_t m = xp->rows, k = xp->cols;
    thread_local std::vector<float> scratch;
    scratch.resize(static_cast<size_t>(m * k));
    float* dst = scratch.data();  // this thread's buffer (the pool's threads write into it)
    const int32_t* perm = w.perm.as<const int32_t>();
    const cpu::RowView xv = *xp;
    pool.ParallelFor(m, cpu::GrainFor(k), [&, dst, perm](size_t b, size_t e) {
      for (size_t r = b; r < e; ++r) {
        const float* src = xv.row(static_cast<int64_t>(r));
        float* d = dst + r * k;
        for (int64_t c = 0; c < k; ++c) {
          DH_CHECK(static_cast<uint32_t>(perm[c]) < static_cast<uint64_t>(k),
                   "matmul perm[{}] = {} outside [0, {})", c, perm[c], k);
          d[c] = src[perm[c]];
        }
      }
    });
    Weight plain = w;
    plain.perm = Tensor();
    return MatMulOn(pool, Tensor(dst, DType::kF32, {m, k}), plain, bias, out);
  }
  MatMulCall c(w);
  if (!FillCall(x, bias, out, &c)) {
    DH_CHECK(!w.rows_released, "matmul: a weight whose rows were released met x {} out {}",
             x.ShapeString(), out.ShapeString());
    Trace("matmul reference {} {}", WeightFormatName(w.format),
                      DTypeName(w.data.dtype));
    return ReferenceBackend::MatMul(x, w, bias, out);
  }
  const MatMulKernel& kernel = KernelFor(c);
  DH_CHECK(!w.rows_released || kernel.run == QuantIntegerDot,
           "matmul: only the integer kernels read a weight whose rows were released");
  NoteKernel(kernel.name(c), kernel.variant);
  if (options().trace_kernels) Trace(kernel.describe(c));
  kernel.run(c, pool);
}

void CpuBackend::MatMuls(const Tensor& x, std::span<const MatMulTarget> targets) {
  MatMulsOn(*pool_, x, targets);
}

void CpuBackend::MatMulsOn(ThreadPool& pool, const Tensor& x,
                           std::span<const MatMulTarget> targets) {
  // Every product's call, all on the integer dot products (MayShareX, then each call's layout
  // and kernel), or MatMul one by one.
  std::array<std::optional<MatMulCall>, kMaxSharedX> calls;
  const size_t count = targets.size();
  bool shared = MayShareX(targets);
  for (size_t i = 0; shared && i < count; ++i) {
    MatMulCall& c = calls[i].emplace(*targets[i].w);
    shared = FillCall(x, targets[i].bias, targets[i].out, &c) &&
             KernelFor(c).run == QuantIntegerDot;
  }
  if (!shared) {
    for (const MatMulTarget& t : targets) MatMulOn(pool, x, *t.w, t.bias, t.out);
    return;
  }
  shared_x_products_ += count;
  const MatMulKernel& kernel = KernelFor(*calls[0]);
  NoteKernel(kernel.name(*calls[0]), kernel.variant);
  if (options().trace_kernels) {
    for (size_t i = 0; i < count; ++i) Trace(kernel.describe(*calls[i]) + " shared-x");
  }
  // x quantized once (named through a reference, as in QuantIntegerDot).
  thread_local cpu::QuantizedActs tl_acts;
  cpu::QuantizedActs& acts = tl_acts;
  cpu::QuantizeActs(calls[0]->quant, &acts, &pool);
  // One chunk per thread, each taking its share of every weight in turn (units of kSharedXRows
  // output rows): the threads read each weight side by side, as MatMul one by one has them, with
  // one dispatch instead of one per weight (in the whole model int4 gate/up ran 4-7 % faster so,
  // and no faster cut into one run of units, a thread's run crossing from gate into up).
  const int64_t chunks = std::max<int64_t>(1, pool.num_threads());
  pool.ParallelFor(static_cast<size_t>(chunks), 1, [&](size_t b, size_t e) {
    for (int64_t chunk = static_cast<int64_t>(b); chunk < static_cast<int64_t>(e); ++chunk) {
      for (size_t i = 0; i < count; ++i) {
        const MatMulCall& c = *calls[i];
        const int64_t units = (c.n() + kSharedXRows - 1) / kSharedXRows;
        const int64_t r0 = chunk * units / chunks * kSharedXRows;
        const int64_t r1 = std::min(c.n(), (chunk + 1) * units / chunks * kSharedXRows);
        if (r0 < r1) cpu::IntegerDotRange(c.quant, acts, r0, r1);
      }
    }
  });
}

void CpuBackend::BatchedGemm(const Tensor& x, std::span<const Weight> w, Tensor out) {
  const cpu::WType wtype = *cpu::WTypeOf(w[0].data.dtype);
  const int64_t heads = static_cast<int64_t>(w.size());
  const int64_t m = x.dim(0), k = x.dim(2), n = out.dim(2);
  // Grows once: a decode step allocates nothing (named through a reference, as below).
  thread_local std::vector<cpu::GemmArgs> calls_storage;
  std::vector<cpu::GemmArgs>& calls = calls_storage;
  calls.resize(static_cast<size_t>(heads));
  for (int64_t h = 0; h < heads; ++h) {
    cpu::GemmArgs& a = calls[static_cast<size_t>(h)];
    a = cpu::GemmArgs();
    a.x = x.Select(1, h).as<const float>();
    a.x_stride = x.stride[0];
    a.m = m;
    a.k = k;
    a.out = out.Select(1, h).as<float>();
    a.out_stride = out.stride[0];
    a.n = n;
    a.w = w[h].data.data;
    a.wtype = wtype;
    a.w_stride = w[h].data.stride[0];
    a.exact_x = w[h].exact_x;
  }
  NoteKernel(cpu::GemmUsesPanels(m, wtype, false) ? "batched-gemm-panels" : "batched-gemm-tiled",
             cpu::DispatchedTargetName);
  Trace("batched_matmul gemm {} H={} M={} N={} K={}", DTypeName(w[0].data.dtype), heads, m, n,
        k);
  cpu::GemmBatched(calls, *pool_);
}

void CpuBackend::BatchedMatMul(const Tensor& x, std::span<const Weight> w, Tensor out) {
  const int64_t heads = static_cast<int64_t>(w.size());
  DH_CHECK(x.ndim == 3 && out.ndim == 3 && x.dim(1) == heads && out.dim(1) == heads &&
               out.dim(0) == x.dim(0) && heads > 0,
           "batched matmul x {} out {} with {} weights", x.ShapeString(), out.ShapeString(), heads);
  const int64_t m = x.dim(0), k = x.dim(2), n = out.dim(2);
  // The heads' own paths: dense weights of one supported type and shape, f32 rows with
  // contiguous last dims.
  const auto wtype = cpu::WTypeOf(w[0].data.dtype);
  bool uniform = wtype && x.dtype == DType::kF32 && out.dtype == DType::kF32 &&
                 (x.stride[2] == 1 || k == 1) && (out.stride[2] == 1 || n == 1);
  for (const Weight& wh : w) {
    uniform = uniform && wh.format == WeightFormat::kDense && wh.data.dtype == w[0].data.dtype &&
              wh.rows == n && wh.cols == k && wh.perm.empty() && wh.exact_x == w[0].exact_x &&
              wh.data.ndim == 2 && (wh.data.stride[1] == 1 || k == 1);
  }
  // Few rows (the GEMV regime, where one head's rows are too little work to spread over the
  // threads on their own): one fused GEMV loop. Rows longer than kBf16GemvMaxCols of bf16
  // weights taking rounded x go to the dot tiles, head by head, as MatMul sends them.
  const bool fused = uniform && m <= cpu::kGemvMaxRows && !LongRowsTakeDotTiles(*wtype, w[0], k);
  if (!fused) {
    // More rows (batched decode, prefill) where MatMul would take every head to the f32 tiled
    // GEMM with x as it is (exact x or f32 weights): every head's GEMM handed out at once
    // (cpu::GemmBatched: the same blocks, so the bits of MatMul head by head, in one dispatch
    // instead of one per head).
    if (uniform && m > cpu::kGemvMaxRows && !TakesRoundedX(*wtype, w[0])) {
      return BatchedGemm(x, w, out);
    }
    for (int64_t h = 0; h < heads; ++h) MatMul(x.Select(1, h), w[h], Tensor(), out.Select(1, h));
    return;
  }
  // x rounded to bf16 where the weights take it (as the heads' MatMul calls above do for any
  // number of rows), [heads][m][k] in this thread's buffer.
  const bool round_x = TakesRoundedX(*wtype, w[0]);
  NoteKernel("batched-gemv", cpu::DispatchedTargetName);
  Trace("batched_matmul gemv {}{} H={} M={} N={} K={}", DTypeName(w[0].data.dtype),
        round_x ? " x-bf16" : "", heads, m, n, k);
  thread_local std::vector<float> tl_x;
  if (round_x) {
    tl_x.resize(static_cast<size_t>(heads * m * k));
    for (int64_t h = 0; h < heads; ++h) {
      cpu::RoundRowsToBf16(x.Select(1, h).as<const float>(), x.stride[0], m, k,
                           tl_x.data() + h * m * k);
    }
  }
  // Grows once: a decode step allocates nothing. Named through a reference: the pool's threads
  // must read the caller's vector, not their own empty one (a crash once the work spreads over
  // threads, e.g. V2-Lite's 16 heads x 512 rows).
  thread_local std::vector<cpu::MatMulArgs> args_storage;
  std::vector<cpu::MatMulArgs>& args = args_storage;
  args.resize(static_cast<size_t>(heads));
  for (int64_t h = 0; h < heads; ++h) {
    cpu::MatMulArgs& a = args[static_cast<size_t>(h)];
    a.x = round_x ? tl_x.data() + h * m * k : x.Select(1, h).as<const float>();
    a.x_stride = round_x ? k : x.stride[0];
    a.m = m;
    a.w = w[h].data.data;
    a.wtype = *wtype;
    a.w_stride = w[h].data.stride[0];
    a.k = k;
    a.out = out.Select(1, h).as<float>();
    a.out_stride = out.stride[0];
  }
  // Items are (head, output row) pairs, head-major; a chunk may span heads.
  pool_->ParallelFor(heads * n, cpu::GrainFor(m * k), [&](size_t b, size_t e) {
    for (size_t i = b; i < e;) {
      const int64_t h = static_cast<int64_t>(i) / n, r = static_cast<int64_t>(i) % n;
      const int64_t stop = std::min<int64_t>(n, r + static_cast<int64_t>(e - i));
      cpu::MatMulRange(args[static_cast<size_t>(h)], r, stop);
      i += static_cast<size_t>(stop - r);
    }
  });
}

}  // namespace dh
