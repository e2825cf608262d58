// CpuBackend: thread pool set-up, kernel tracing, and for each op the choice between the SIMD
// kernels of cpu_kernels.cc (f32 activations with contiguous rows) and the reference fallback.
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/quant_matmul.h"
#include "backend/cpu/quant_vnni.h"
#include "backend/reference/reference_ops.h"
#include "base/check.h"
#include "base/log.h"
#include "hwy/targets.h"

namespace dh {
namespace {

using cpu::WType;

// A tensor seen as `rows` rows of `cols` contiguous elements, `stride` elements apart.
struct RowView {
  char* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;
  bool contiguous = false;  // rows are back to back
  float* row(int64_t r) const { return reinterpret_cast<float*>(data) + r * stride; }
};

std::optional<RowView> AsRows(const Tensor& t, DType dtype = DType::kF32) {
  if (t.dtype != dtype || t.ndim < 1 || t.empty()) return std::nullopt;
  const int last = t.ndim - 1;
  if (t.shape[last] != 1 && t.stride[last] != 1) return std::nullopt;
  RowView v;
  v.data = static_cast<char*>(t.data);
  v.cols = t.shape[last];
  v.rows = 1;
  for (int i = 0; i < last; ++i) v.rows *= t.shape[i];
  v.stride = t.ndim >= 2 ? t.stride[last - 1] : v.cols;
  // Leading dims must collapse into one stride.
  for (int i = 0; i + 1 < last; ++i) {
    if (t.shape[i] != 1 && t.stride[i] != t.stride[i + 1] * t.shape[i + 1]) return std::nullopt;
  }
  if (v.rows == 1) v.stride = v.cols;
  v.contiguous = v.stride == v.cols;
  return v;
}

std::optional<WType> WTypeOf(DType t) {
  switch (t) {
    case DType::kF32: return WType::kF32;
    case DType::kBF16: return WType::kBF16;
    case DType::kF16: return WType::kF16;
    default: return std::nullopt;
  }
}

// A vector of n weights (norm weight) usable by the kernels.
bool IsPlainVector(const Tensor& t, int64_t n) {
  return !t.empty() && WTypeOf(t.dtype) && t.numel() == n && (t.ndim <= 1 || t.contiguous()) &&
         (t.ndim != 1 || t.stride[0] == 1 || n == 1);
}

bool SameRows(const RowView& a, const RowView& b) { return a.rows == b.rows && a.cols == b.cols; }

// Chunk size (in units of `work_per_item`) that gives each thread at least ~32K operations.
size_t GrainFor(int64_t work_per_item) {
  return static_cast<size_t>(std::max<int64_t>(1, 32768 / std::max<int64_t>(1, work_per_item)));
}

// Runs fn(a, b, out, n) over all elements of three same-shaped row views: over flat chunks when
// all are contiguous (one long row parallelises too), else row by row.
template <typename Fn>
void ForEachElementChunk(ThreadPool& pool, const RowView& a, const RowView& b, const RowView& o,
                         Fn fn) {
  if (a.contiguous && b.contiguous && o.contiguous) {
    pool.ParallelFor(a.rows * a.cols, 16384, [&](size_t begin, size_t end) {
      fn(a.row(0) + begin, b.row(0) + begin, o.row(0) + begin, static_cast<int64_t>(end - begin));
    });
    return;
  }
  pool.ParallelFor(a.rows, GrainFor(a.cols), [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) fn(a.row(r), b.row(r), o.row(r), a.cols);
  });
}

// DH_CPU_TIER=avx2|avxvnni (unset: the best the CPU has) runs the backend as on a CPU of that
// x86 tier: Highway kernels no wider than AVX2, and the integer-dot kernel of that tier (unless
// DH_INTEGER_DOT names one), so an AVX-512 machine tests and benchmarks its AVX2 paths.
void ApplyCpuTierFromEnv() {
  static const bool applied = [] {
    const char* v = std::getenv("DH_CPU_TIER");
    if (v == nullptr || *v == '\0') return false;
    const std::string_view s(v);
    if (s != "avx2" && s != "avxvnni") {
      DH_LOG(Warning, "DH_CPU_TIER={}: expected avx2 or avxvnni; using the CPU's best", s);
      return false;
    }
#if HWY_ARCH_X86
    hwy::DisableTargets(HWY_AVX2 - 1);  // every x86 target above AVX2 (lower bits are better)
#endif
    const char* dot = std::getenv("DH_INTEGER_DOT");
    const std::string_view d = dot ? dot : "";
    if (d != "avx2" && d != "avxvnni" && d != "vnni512") {
      cpu::SetIntegerDotPathForTest(s == "avx2" ? cpu::IntegerDotPath::kAvx2
                                                : cpu::IntegerDotPath::kAvxVnni);
    }
    return true;
  }();
  (void)applied;
}

}  // namespace

CpuBackend::CpuBackend(const BackendOptions& options)
    : ReferenceBackend(options),
      pool_(std::make_unique<ThreadPool>(options.num_threads > 0 ? options.num_threads
                                                                 : AvailableCpus())) {
  ApplyCpuTierFromEnv();
}

CpuBackend::~CpuBackend() = default;

bool CpuBackend::Supports(const OpDesc& op) const {
  switch (op.op) {
    case OpKind::kMatMul:
    case OpKind::kEmbedding:
      return op.format != WeightFormat::kDense || WTypeOf(op.dtype).has_value();
    case OpKind::kRmsNorm:
    case OpKind::kAddRmsNorm:
    case OpKind::kAttention:
    case OpKind::kSiluMul:
    case OpKind::kAdd:
      return op.dtype == DType::kF32;
    case OpKind::kBatchedMatMul:  // the GEMV kernel over all heads, or MatMul per head
    case OpKind::kMoeExperts:     // grouped over the accelerated MatMul and SiluMul
      return true;
    default:
      return false;
  }
}

void CpuBackend::Trace(const std::string& what) {
  if (!options().trace_kernels) return;
  std::lock_guard<std::mutex> lock(trace_mu_);
  if (traced_.insert(what).second) {
    DH_LOG(Info, "kernel: {} target={}", what, cpu::DispatchedTargetName());
  }
}

void CpuBackend::Embedding(const Weight& table, const Tensor& ids, Tensor out) {
  const auto o = AsRows(out);
  const auto wtype = WTypeOf(table.data.dtype);
  if (table.format != WeightFormat::kDense || !wtype || !o || table.data.ndim != 2 ||
      table.data.stride[1] != 1 || o->rows != ids.numel() || o->cols != table.cols) {
    Trace(fmt::format("embedding reference {}", WeightFormatName(table.format)));
    return ReferenceBackend::Embedding(table, ids, out);
  }
  Trace(fmt::format("embedding {} T={} H={}", DTypeName(table.data.dtype), o->rows, o->cols));
  const size_t esize = DTypeSize(table.data.dtype);
  pool_->ParallelFor(o->rows, GrainFor(o->cols), [&](size_t b, size_t e) {
    for (size_t t = b; t < e; ++t) {
      const int32_t id = ref::GetI32(ids, t);
      DH_CHECK(id >= 0 && id < table.rows, "token id {} outside the vocabulary of {}", id,
               table.rows);
      const char* src = static_cast<const char*>(table.data.data) +
                        static_cast<int64_t>(id) * table.data.stride[0] * esize;
      cpu::WidenRow(src, *wtype, o->row(t), o->cols);
    }
  });
}

void CpuBackend::RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor out) {
  const auto xr = AsRows(x), o = AsRows(out);
  if (!xr || !o || !SameRows(*xr, *o) || !IsPlainVector(weight, xr->cols)) {
    Trace("rmsnorm reference");
    return ReferenceBackend::RmsNorm(x, weight, eps, out);
  }
  Trace(fmt::format("rmsnorm T={} H={} w={}", xr->rows, xr->cols, DTypeName(weight.dtype)));
  const WType wtype = *WTypeOf(weight.dtype);
  pool_->ParallelFor(xr->rows, GrainFor(xr->cols), [&](size_t b, size_t e) {
    for (size_t r = b; r < e; ++r) {
      const float ss = cpu::SumOfSquares(xr->row(r), xr->cols);
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(xr->cols) + eps);
      cpu::ScaleByWeight(xr->row(r), inv, weight.data, wtype, o->row(r), xr->cols);
    }
  });
}

void CpuBackend::AddRmsNorm(Tensor residual, const Tensor& x, const Tensor& weight, float eps,
                            Tensor out) {
  const auto res = AsRows(residual), xr = AsRows(x), o = AsRows(out);
  if (!res || !xr || !o || !SameRows(*res, *xr) || !SameRows(*res, *o) ||
      !IsPlainVector(weight, res->cols)) {
    Trace("add_rmsnorm reference");
    return ReferenceBackend::AddRmsNorm(residual, x, weight, eps, out);
  }
  Trace(fmt::format("add_rmsnorm T={} H={} w={}", res->rows, res->cols, DTypeName(weight.dtype)));
  const WType wtype = *WTypeOf(weight.dtype);
  pool_->ParallelFor(res->rows, GrainFor(res->cols), [&](size_t b, size_t e) {
    for (size_t r = b; r < e; ++r) {
      cpu::AddRow(res->row(r), xr->row(r), res->row(r), res->cols);
      const float ss = cpu::SumOfSquares(res->row(r), res->cols);
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(res->cols) + eps);
      cpu::ScaleByWeight(res->row(r), inv, weight.data, wtype, o->row(r), res->cols);
    }
  });
}

namespace {

// Which kernel family a MatMul takes by the rows of x: GEMV kernels for up to kGemvMaxRows rows
// (decode), tiled GEMM above (prefill, batches).
enum class MatMulPath : uint8_t { kGemv, kGemm };

// Whether quant_matmul's kernels take weight w: int8 / int4 codes with contiguous rows and
// f32 scales (and mins) laid out [rows, groups].
bool QuantKernelApplies(const Weight& w) {
  const bool int4 = w.format == WeightFormat::kInt4;
  if (w.format != WeightFormat::kInt8 && !int4) return false;
  if (w.data.dtype != (int4 ? DType::kU8 : DType::kI8)) return false;
  auto plain_f32 = [&](const Tensor& t) {
    return t.dtype == DType::kF32 && t.ndim == 2 && t.shape[0] == w.rows &&
           t.shape[1] == (w.cols + w.group_size - 1) / std::max(w.group_size, 1) &&
           (t.stride[1] == 1 || t.shape[1] == 1);
  };
  return cpu::QuantMatMulSupports(int4, w.cols, w.group_size) && plain_f32(w.scales) &&
         (!int4 || plain_f32(w.mins));
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
      dense.wtype = *WTypeOf(w.data.dtype);
      dense.w_stride = w.data.stride[0];
    }
    quant_ok = QuantKernelApplies(w);
    if (quant_ok) {
      static_cast<cpu::ActivationArgs&>(quant) = dense;
      quant.int4 = w.format == WeightFormat::kInt4;
      quant.q = w.data.data;
      quant.q_stride = w.data.stride[0];
      quant.scales = w.scales.as<const float>();
      quant.scale_stride = w.scales.stride[0];
      if (quant.int4) {
        quant.mins = w.mins.as<const float>();
        quant.min_stride = w.mins.stride[0];
      }
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
};

void DenseGemm(const MatMulCall& c, ThreadPool& pool) {
  cpu::Gemm(GemmOver(c.dense, c.n(), nullptr), pool);
}

void DenseGemv(const MatMulCall& c, ThreadPool& pool) {
  pool.ParallelFor(c.n(), GrainFor(c.m() * c.k()),
                   [&](size_t b, size_t e) { cpu::MatMulRange(c.dense, b, e); });
}

// x quantized to int8 once per call, dot products in VNNI units (quant_vnni.h).
void QuantIntegerDot(const MatMulCall& c, ThreadPool& pool) {
  // This thread's buffers, reused across calls (assign() keeps their capacity). Named through
  // a reference: the pool's threads must read the caller's object, not their own.
  thread_local cpu::QuantizedActs tl_acts;
  cpu::QuantizedActs& acts = tl_acts;
  cpu::QuantizeActs(c.quant, &acts);
  pool.ParallelFor(c.n(), GrainFor(c.m() * c.k()),
                   [&](size_t b, size_t e) { cpu::IntegerDotRange(c.quant, acts, b, e); });
}

// int8 / int4 with few rows of x (decode): dequantized in registers (quant_matmul.h).
void QuantGemv(const MatMulCall& c, ThreadPool& pool) {
  pool.ParallelFor(c.n(), GrainFor(c.m() * c.k()),
                   [&](size_t b, size_t e) { cpu::QuantMatMulRange(c.quant, b, e); });
}

// FP8 blocks with few rows of x: decoded in registers through f16 (quant_matmul.h).
void Fp8Gemv(const MatMulCall& c, ThreadPool& pool) {
  pool.ParallelFor(c.n(), GrainFor(c.m() * c.k()),
                   [&](size_t b, size_t e) { cpu::Fp8MatMulRange(c.fp8, b, e); });
}

// Prefill and batches over a non-dense weight: the tiled GEMM (gemm.h) pulls f32 panels through
// a callback. A panel narrower than the row decodes the whole row and keeps its slice: decoding
// is a few operations per weight, against 2*M flops per weight in the GEMM.
void DequantGemm(const MatMulCall& c, ThreadPool& pool) {
  const int64_t k = c.k();
  const cpu::WeightRowsFn rows_fn = [&](int64_t row_begin, int64_t count, int64_t col_begin,
                                        int64_t col_count, float* dst) {
    if (col_begin == 0 && col_count == k) return c.DecodeRows(row_begin, count, dst);
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
  pool.ParallelFor(c.n(), GrainFor(c.m() * k), [&](size_t b, size_t e) {
    std::vector<float> rows(kRowsPerStep * k);
    for (int64_t j0 = b; j0 < static_cast<int64_t>(e); j0 += kRowsPerStep) {
      const int64_t nb = std::min<int64_t>(kRowsPerStep, e - j0);
      c.DecodeRows(j0, nb, rows.data());
      cpu::MatMulArgs step = c.dense;
      step.w = rows.data();
      step.wtype = WType::kF32;
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
// checks); the first entry that takes a call runs it. `describe` gives the --trace-kernels line.
struct MatMulKernel {
  uint32_t formats;  // FormatBit mask
  uint8_t paths;     // PathBit mask
  bool (*fits)(const MatMulCall&);
  std::string (*describe)(const MatMulCall&);
  void (*run)(const MatMulCall&, ThreadPool&);

  bool Takes(const MatMulCall& c) const {
    return (formats & FormatBit(c.w.format)) != 0 && (paths & PathBit(c.path)) != 0 && fits(c);
  }
};

const MatMulKernel kMatMulKernels[] = {
    {kDenseOnly, PathBit(MatMulPath::kGemm), [](const MatMulCall&) { return true; },
     [](const MatMulCall& c) {
       return fmt::format("matmul gemm-tiled {} M={} N={} K={}", DTypeName(c.w.data.dtype),
                          c.m(), c.n(), c.k());
     },
     DenseGemm},
    {kDenseOnly, PathBit(MatMulPath::kGemv), [](const MatMulCall&) { return true; },
     [](const MatMulCall& c) {
       return fmt::format("matmul {} {} M={} N={} K={}", c.kind(), DTypeName(c.w.data.dtype),
                          c.m(), c.n(), c.k());
     },
     DenseGemv},
    {kIntFormats, kAnyPath,
     [](const MatMulCall& c) { return c.quant_ok && cpu::UseIntegerDot(c.quant); },
     [](const MatMulCall& c) {
       return fmt::format("matmul {} {} g{} {} M={} N={} K={}", c.kind(),
                          WeightFormatName(c.w.format), c.w.group_size, cpu::IntegerDotName(),
                          c.m(), c.n(), c.k());
     },
     QuantIntegerDot},
    {kIntFormats, PathBit(MatMulPath::kGemv), [](const MatMulCall& c) { return c.quant_ok; },
     [](const MatMulCall& c) {
       return fmt::format("matmul gemv {} g{} f32 M={} N={} K={}", WeightFormatName(c.w.format),
                          c.w.group_size, c.m(), c.n(), c.k());
     },
     QuantGemv},
    {kFp8Only, PathBit(MatMulPath::kGemv), [](const MatMulCall& c) { return c.fp8_ok; },
     [](const MatMulCall& c) {
       return fmt::format("matmul gemv fp8 b{}x{} f16-decode M={} N={} K={}", c.w.block_rows,
                          c.w.block_cols, c.m(), c.n(), c.k());
     },
     Fp8Gemv},
    {kNotDense, PathBit(MatMulPath::kGemm), [](const MatMulCall&) { return true; },
     [](const MatMulCall& c) {
       return fmt::format("matmul gemm-tiled {} dequant{} M={} N={} K={}",
                          WeightFormatName(c.w.format), c.fp8_ok ? " f16-decode" : "", c.m(),
                          c.n(), c.k());
     },
     DequantGemm},
    {kNotDense, PathBit(MatMulPath::kGemv), [](const MatMulCall&) { return true; },
     [](const MatMulCall& c) {
       return fmt::format("matmul {} {} dequant{} M={} N={} K={}", c.kind(),
                          WeightFormatName(c.w.format), c.fp8_ok ? " f16-decode" : "", c.m(),
                          c.n(), c.k());
     },
     DequantGemv},
};

}  // namespace

void CpuBackend::MatMul(const Tensor& x, const Weight& w, const Tensor& bias, Tensor out) {
  if (!w.perm.empty()) {
    // Input permutation (GPTQ act-order): gather x[:, perm] into a scratch buffer, then multiply
    // by the same weight without the permutation.
    const auto xp = AsRows(x);
    const bool perm_ok = w.perm.dtype == DType::kI32 && w.perm.ndim == 1 &&
                         w.perm.shape[0] == w.cols && (w.perm.stride[0] == 1 || w.cols == 1);
    if (!xp || !perm_ok || xp->cols != w.cols) {
      Trace(fmt::format("matmul reference permuted {}", WeightFormatName(w.format)));
      return ReferenceBackend::MatMul(x, w, bias, out);
    }
    const int64_t m = xp->rows, k = xp->cols;
    thread_local std::vector<float> scratch;
    scratch.resize(static_cast<size_t>(m * k));
    float* dst = scratch.data();  // this thread's buffer (the pool's threads write into it)
    const int32_t* perm = w.perm.as<const int32_t>();
    const RowView xv = *xp;
    pool_->ParallelFor(m, GrainFor(k), [&, dst, perm](size_t b, size_t e) {
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
    return MatMul(Tensor(dst, DType::kF32, {m, k}), plain, bias, out);
  }
  const auto xr = AsRows(x), o = AsRows(out);
  const bool bias_ok = bias.empty() || (bias.dtype == DType::kF32 && IsPlainVector(bias, w.rows));
  const bool dense = w.format == WeightFormat::kDense;
  const auto wtype = WTypeOf(w.data.dtype);
  const bool layout_ok = xr && o && bias_ok && xr->cols == w.cols && o->rows == xr->rows &&
                         o->cols == w.rows && w.data.ndim == 2 &&
                         (w.data.stride[1] == 1 || w.cols == 1);
  if (!layout_ok || (dense && !wtype)) {
    Trace(fmt::format("matmul reference {} {}", WeightFormatName(w.format),
                      DTypeName(w.data.dtype)));
    return ReferenceBackend::MatMul(x, w, bias, out);
  }
  MatMulCall c(w);
  cpu::MatMulArgs& a = c.dense;
  a.x = xr->row(0);
  a.x_stride = xr->stride;
  a.m = xr->rows;
  a.k = w.cols;
  a.bias = bias.empty() ? nullptr : bias.as<const float>();
  a.out = o->row(0);
  a.out_stride = o->stride;
  c.Prepare();
  for (const MatMulKernel& kernel : kMatMulKernels) {
    if (kernel.Takes(c)) {
      Trace(kernel.describe(c));
      kernel.run(c, *pool_);
      return;
    }
  }
  DH_CHECK(false, "no matmul kernel for {} {}", WeightFormatName(w.format),
           DTypeName(w.data.dtype));
}

void CpuBackend::BatchedMatMul(const Tensor& x, std::span<const Weight> w, Tensor out) {
  const int64_t heads = static_cast<int64_t>(w.size());
  DH_CHECK(x.ndim == 3 && out.ndim == 3 && x.dim(1) == heads && out.dim(1) == heads &&
               out.dim(0) == x.dim(0) && heads > 0,
           "batched matmul x {} out {} with {} weights", x.ShapeString(), out.ShapeString(), heads);
  const int64_t m = x.dim(0), k = x.dim(2), n = out.dim(2);
  // The fused path: dense weights of one supported type and shape, f32 rows with contiguous
  // last dims, and few rows (the GEMV regime, where one head's rows are too little work to
  // spread over the threads on their own).
  const auto wtype = WTypeOf(w[0].data.dtype);
  bool fused = m <= cpu::kGemvMaxRows && wtype && x.dtype == DType::kF32 &&
               out.dtype == DType::kF32 && (x.stride[2] == 1 || k == 1) &&
               (out.stride[2] == 1 || n == 1);
  for (const Weight& wh : w) {
    fused = fused && wh.format == WeightFormat::kDense && wh.data.dtype == w[0].data.dtype &&
            wh.rows == n && wh.cols == k && wh.perm.empty() && wh.data.ndim == 2 &&
            (wh.data.stride[1] == 1 || k == 1);
  }
  if (!fused) {
    for (int64_t h = 0; h < heads; ++h) MatMul(x.Select(1, h), w[h], Tensor(), out.Select(1, h));
    return;
  }
  Trace(fmt::format("batched_matmul gemv {} H={} M={} N={} K={}", DTypeName(w[0].data.dtype),
                    heads, m, n, k));
  std::vector<cpu::MatMulArgs> args(static_cast<size_t>(heads));
  for (int64_t h = 0; h < heads; ++h) {
    cpu::MatMulArgs& a = args[static_cast<size_t>(h)];
    a.x = x.Select(1, h).as<const float>();
    a.x_stride = x.stride[0];
    a.m = m;
    a.w = w[h].data.data;
    a.wtype = *wtype;
    a.w_stride = w[h].data.stride[0];
    a.k = k;
    a.out = out.Select(1, h).as<float>();
    a.out_stride = out.stride[0];
  }
  // Items are (head, output row) pairs, head-major; a chunk may span heads.
  pool_->ParallelFor(heads * n, GrainFor(m * k), [&](size_t b, size_t e) {
    for (size_t i = b; i < e;) {
      const int64_t h = static_cast<int64_t>(i) / n, r = static_cast<int64_t>(i) % n;
      const int64_t stop = std::min<int64_t>(n, r + static_cast<int64_t>(e - i));
      cpu::MatMulRange(args[static_cast<size_t>(h)], r, stop);
      i += static_cast<size_t>(stop - r);
    }
  });
}

void CpuBackend::Attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                           const AttentionMeta& meta, float scale, Tensor out) {
  auto inner_ok = [](const Tensor& t) {
    return t.dtype == DType::kF32 && t.ndim == 3 && (t.stride[2] == 1 || t.shape[2] == 1);
  };
  if (!inner_ok(q) || !inner_ok(k_cache) || !inner_ok(v_cache) || !inner_ok(out)) {
    Trace("attention reference");
    return ReferenceBackend::Attention(q, k_cache, v_cache, meta, scale, out);
  }
  const int64_t hq = q.shape[1], dk = q.shape[2], hkv = k_cache.shape[1], dv = v_cache.shape[2];
  DH_CHECK(hkv > 0 && hq % hkv == 0 && v_cache.shape[1] == hkv && k_cache.shape[2] == dk &&
               out.shape[0] == q.shape[0] && out.shape[1] == hq && out.shape[2] == dv,
           "attention q {} k_cache {} v_cache {} out {}", q.ShapeString(), k_cache.ShapeString(),
           v_cache.ShapeString(), out.ShapeString());
  const int64_t t_count = q.shape[0];
  Trace(fmt::format("attention T={} Hq={} Hkv={} Dk={} Dv={} seqs={}", t_count, hq, hkv, dk, dv,
                    meta.num_seqs));
  // Per sequence, the cache slot of every position; per query row, its sequence and position.
  std::vector<std::vector<int64_t>> slots(meta.num_seqs);
  std::vector<int32_t> row_seq(t_count, -1);
  std::vector<int64_t> row_pos(t_count, 0);
  int64_t max_len = 0;
  for (int s = 0; s < meta.num_seqs; ++s) {
    const ref::SeqLayout seq = ref::GetSeqLayout(meta, s);
    DH_CHECK(seq.query_start >= 0 && seq.query_end <= t_count, "sequence {} rows [{}, {}) of {}",
             s, seq.query_start, seq.query_end, t_count);
    slots[s].resize(seq.seq_len);
    for (int64_t p = 0; p < seq.seq_len; ++p) {
      slots[s][p] = ref::SlotOf(seq, meta.block_size, p);
      DH_CHECK(slots[s][p] >= 0 && slots[s][p] < k_cache.shape[0], "slot {} of {}", slots[s][p],
               k_cache.shape[0]);
    }
    const int32_t num_queries = seq.query_end - seq.query_start;
    for (int32_t t = seq.query_start; t < seq.query_end; ++t) {
      row_seq[t] = s;
      row_pos[t] = seq.seq_len - num_queries + (t - seq.query_start);
    }
    max_len = std::max<int64_t>(max_len, seq.seq_len);
  }
  const int64_t group = hq / hkv;
  const float* qd = q.as<const float>();
  const float* kd = k_cache.as<const float>();
  const float* vd = v_cache.as<const float>();
  float* od = out.as<float>();
  pool_->ParallelFor(t_count * hq, 1, [&](size_t b, size_t e) {
    std::vector<float> scores(max_len);
    for (size_t item = b; item < e; ++item) {
      const int64_t t = item / hq, h = item % hq;
      if (row_seq[t] < 0) continue;  // a row no sequence owns
      cpu::AttendArgs a;
      a.q = qd + t * q.stride[0] + h * q.stride[1];
      a.k_base = kd + (h / group) * k_cache.stride[1];
      a.k_slot_stride = k_cache.stride[0];
      a.v_base = vd + (h / group) * v_cache.stride[1];
      a.v_slot_stride = v_cache.stride[0];
      a.dk = dk;
      a.dv = dv;
      a.slots = slots[row_seq[t]].data();
      a.num_positions = row_pos[t] + 1;
      a.scale = scale;
      a.scores = scores.data();
      a.out = od + t * out.stride[0] + h * out.stride[1];
      cpu::Attend(a);
    }
  });
}

void CpuBackend::SiluMul(const Tensor& gate, const Tensor& up, Tensor out) {
  const auto g = AsRows(gate), u = AsRows(up), o = AsRows(out);
  if (!g || !u || !o || !SameRows(*g, *u) || !SameRows(*g, *o)) {
    Trace("silu_mul reference");
    return ReferenceBackend::SiluMul(gate, up, out);
  }
  Trace(fmt::format("silu_mul T={} I={}", g->rows, g->cols));
  ForEachElementChunk(*pool_, *g, *u, *o, cpu::SiluMulRow);
}

void CpuBackend::Add(const Tensor& a, const Tensor& b, Tensor out) {
  const auto ar = AsRows(a), br = AsRows(b), o = AsRows(out);
  if (!ar || !br || !o || !SameRows(*ar, *br) || !SameRows(*ar, *o)) {
    Trace("add reference");
    return ReferenceBackend::Add(a, b, out);
  }
  Trace(fmt::format("add T={} H={}", ar->rows, ar->cols));
  ForEachElementChunk(*pool_, *ar, *br, *o, cpu::AddRow);
}

void CpuBackend::Rope(Tensor x, const Tensor& positions, const RopeParams& p) {
  if (options().trace_kernels) {
    Trace(fmt::format("rope reference T={} H={} D={} rotary={}", x.ndim > 0 ? x.shape[0] : 0,
                      x.ndim > 1 ? x.shape[1] : 0, x.ndim > 2 ? x.shape[2] : 0, p.rot_dim));
  }
  ReferenceBackend::Rope(x, positions, p);
}

void CpuBackend::KvWrite(const Tensor& k, const Tensor& v, Tensor k_cache, Tensor v_cache,
                         const Tensor& slot_mapping) {
  if (options().trace_kernels) {
    Trace(fmt::format("kv_write reference k={} v={} cache={}", k.ShapeString(),
                      v.empty() ? "none" : v.ShapeString(), DTypeName(k_cache.dtype)));
  }
  ReferenceBackend::KvWrite(k, v, k_cache, v_cache, slot_mapping);
}

void CpuBackend::Copy(const Tensor& src, Tensor dst) {
  if (options().trace_kernels) {
    Trace(fmt::format("copy reference {} {} -> {}", src.ShapeString(), DTypeName(src.dtype),
                      DTypeName(dst.dtype)));
  }
  ReferenceBackend::Copy(src, dst);
}

void CpuBackend::GatherRows(const Tensor& x, const Tensor& rows, Tensor out) {
  if (options().trace_kernels) {
    Trace(fmt::format("gather_rows reference n={} H={}", rows.numel(),
                      x.ndim > 1 ? x.shape[1] : 0));
  }
  ReferenceBackend::GatherRows(x, rows, out);
}

void CpuBackend::MoeGate(const Tensor& logits, const Tensor& bias, const MoeGateParams& p,
                         Tensor topk_ids, Tensor topk_weights) {
  if (options().trace_kernels) {
    Trace(fmt::format("moe_gate reference T={} E={} k={}", logits.ndim > 0 ? logits.shape[0] : 0,
                      logits.ndim > 1 ? logits.shape[1] : 0,
                      topk_ids.ndim > 1 ? topk_ids.shape[1] : 0));
  }
  ReferenceBackend::MoeGate(logits, bias, p, topk_ids, topk_weights);
}

void CpuBackend::MoeExperts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                            std::span<const ExpertWeights> experts, Tensor out) {
  if (options().trace_kernels) {
    Trace(fmt::format("moe_experts grouped T={} H={} experts={} k={}",
                      x.ndim > 0 ? x.shape[0] : 0, x.ndim > 1 ? x.shape[1] : 0, experts.size(),
                      topk_ids.ndim > 1 ? topk_ids.shape[1] : 0));
  }
  ReferenceBackend::MoeExperts(x, topk_ids, topk_weights, experts, out);
}

}  // namespace dh
