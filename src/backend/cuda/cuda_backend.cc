// CudaBackend: memory, streams, cuBLAS GEMMs and the launch of cuda_kernels.cu per op, with the
// host fallback for what the kernels do not take (cuda_backend.h).
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "backend/cuda/cuda_kernels.h"
#include "base/check.h"
#include "base/log.h"

namespace dh {
namespace {

void Check(cudaError_t e, const char* what) {
  DH_CHECK(e == cudaSuccess, "cuda: {}: {}", what, cudaGetErrorString(e));
}
void CheckBlas(cublasStatus_t s, const char* what) {
  DH_CHECK(s == CUBLAS_STATUS_SUCCESS, "cublas: {}: status {}", what, static_cast<int>(s));
}

std::optional<int> ElemOf(DType t) {
  switch (t) {
    case DType::kF32: return cuda::kElemF32;
    case DType::kBF16: return cuda::kElemBF16;
    case DType::kF16: return cuda::kElemF16;
    default: return std::nullopt;
  }
}

// `t` as rows of contiguous elements (leading dims collapsed into one row stride).
std::optional<cuda::Rows> AsRows(const Tensor& t, bool f32_only = true) {
  if (t.empty() || t.ndim < 1) return std::nullopt;
  const auto elem = ElemOf(t.dtype);
  if (!elem || (f32_only && *elem != cuda::kElemF32)) return std::nullopt;
  const int last = t.ndim - 1;
  if (t.shape[last] != 1 && t.stride[last] != 1) return std::nullopt;
  cuda::Rows r;
  r.data = t.data;
  r.elem = *elem;
  r.cols = t.shape[last];
  r.rows = 1;
  for (int i = 0; i < last; ++i) r.rows *= t.shape[i];
  r.stride = t.ndim >= 2 ? t.stride[last - 1] : r.cols;
  for (int i = 0; i + 1 < last; ++i) {
    if (t.shape[i] != 1 && t.stride[i] != t.stride[i + 1] * t.shape[i + 1]) return std::nullopt;
  }
  if (r.rows <= 1) r.stride = r.cols;
  return r;
}

std::optional<cuda::View> AsView(const Tensor& t, bool need_float = true) {
  if (t.ndim < 1 || t.ndim > 4) return std::nullopt;
  cuda::View v;
  v.data = t.data;
  const auto elem = ElemOf(t.dtype);
  if (need_float && !elem) return std::nullopt;
  v.elem = elem.value_or(cuda::kElemF32);
  v.ndim = t.ndim;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.stride[i] < 0) return std::nullopt;
    v.shape[i] = t.shape[i];
    v.stride[i] = t.stride[i];
  }
  return v;
}

// A contiguous i32 vector on the device.
bool IsI32Vector(const Tensor& t) { return !t.empty() && t.dtype == DType::kI32 && t.contiguous(); }

// A contiguous vector of n float elements.
bool IsVector(const Tensor& t, int64_t n) {
  return !t.empty() && ElemOf(t.dtype) && t.numel() == n && t.contiguous();
}

class CudaBuffer : public Buffer {
 public:
  CudaBuffer(void* data, size_t size, std::function<void(const void*, size_t)> forget)
      : data_(data), size_(size), forget_(std::move(forget)) {}
  ~CudaBuffer() override {
    if (data_ == nullptr) return;
    forget_(data_, size_);
    cudaFree(data_);
  }
  void* data() override { return data_; }
  size_t size() const override { return size_; }

 private:
  void* data_;
  size_t size_;
  std::function<void(const void*, size_t)> forget_;
};

}  // namespace

Result<std::unique_ptr<Backend>> CudaBackend::Create(const BackendOptions& options) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    return Unsupported("cuda: no usable CUDA device (cudaGetDeviceCount: {})",
                       cudaGetErrorString(e));
  }
  if (count == 0) return Unsupported("cuda: no CUDA device on this machine");
  return std::unique_ptr<Backend>(new CudaBackend(options, 0));
}

CudaBackend::CudaBackend(const BackendOptions& options, int device)
    : HostFallbackBackend(options), device_(device) {
  Check(cudaSetDevice(device_), "set device");
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, device_), "device properties");
  tag_ = fmt::format("sm_{}{} {}", prop.major, prop.minor, prop.name);
  Check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream create");
  CheckBlas(cublasCreate(&cublas_), "create");
  CheckBlas(cublasSetStream(cublas_, stream_), "set stream");
  if (const char* p = std::getenv("DH_CUDA_OP_TIMES"); p != nullptr && p[0] != '\0') {
    times_path_ = p;
    Check(cudaEventCreate(&ev_start_), "event create");
    Check(cudaEventCreate(&ev_stop_), "event create");
  }
  DH_LOG(Info, "cuda: device {} ({}), {:.1f} GiB", device_, tag_,
         prop.totalGlobalMem / 1073741824.0);
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(stream_);
  if (!times_path_.empty()) {
    std::string json = fmt::format("{{\"device\": \"{}\", \"ops\": {{", tag_);
    bool first = true;
    for (const auto& [op, t] : times_) {
      json += fmt::format("{}\"{}\": {{\"count\": {}, \"ms\": {:.4f}}}", first ? "" : ", ", op,
                          t.count, t.ms);
      first = false;
    }
    json += "}}\n";
    std::ofstream(times_path_) << json;
    cudaEventDestroy(ev_start_);
    cudaEventDestroy(ev_stop_);
  }
  for (ScratchSlot& s : scratch_) {
    if (s.data) cudaFree(s.data);
  }
  cublasDestroy(cublas_);
  cudaStreamDestroy(stream_);
}

void CudaBackend::Begin() {
  if (!times_path_.empty()) Check(cudaEventRecord(ev_start_, stream_), "event record");
}

void CudaBackend::End(const char* op) {
  if (times_path_.empty()) return;
  Check(cudaEventRecord(ev_stop_, stream_), "event record");
  Check(cudaEventSynchronize(ev_stop_), "event synchronize");
  float ms = 0;
  Check(cudaEventElapsedTime(&ms, ev_start_, ev_stop_), "event elapsed");
  OpTime& t = times_[op];
  ++t.count;
  t.ms += ms;
}

bool CudaBackend::Supports(const OpDesc& op) const {
  switch (op.op) {
    case OpKind::kMatMul:
    case OpKind::kEmbedding:
      return op.format == WeightFormat::kDense && ElemOf(op.dtype).has_value();
    case OpKind::kKvWrite:
    case OpKind::kAttention:
    case OpKind::kKvGather:  // KV caches in f32/bf16/f16; the quantized ones fall back
      return ElemOf(op.dtype).has_value();
    case OpKind::kMoeExperts:  // grouped here; each expert MatMul as above
    default: return true;
  }
}

bool CudaBackend::IsDeviceMemory(const void* p) const {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // clear the error state
    return false;
  }
  return attr.type == cudaMemoryTypeDevice;
}

void* CudaBackend::Scratch(int slot, size_t bytes) {
  ScratchSlot& s = scratch_[slot];
  if (s.bytes < bytes) {
    if (s.data) Check(cudaFree(s.data), "free scratch");  // waits for the kernels using it
    s.bytes = std::max(bytes, s.bytes * 2);
    Check(cudaMalloc(&s.data, s.bytes), "scratch allocation");
  }
  return s.data;
}

std::unique_ptr<Buffer> CudaBackend::Allocate(size_t bytes) {
  void* p = nullptr;
  if (bytes > 0) {
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      DH_LOG(Error, "cuda: cannot allocate {} bytes of device memory: {}", bytes,
             cudaGetErrorString(e));
      return nullptr;
    }
  }
  return std::make_unique<CudaBuffer>(p, bytes, ForgetHostCopiesHook());
}

void CudaBackend::CopyToDevice(const Tensor& dst, const void* src) {
  DH_CHECK(dst.contiguous(), "CopyToDevice into a strided tensor {}", dst.ShapeString());
  if (dst.nbytes() == 0) return;
  // From pageable host memory this returns once `src` has been staged, so callers may free it.
  Check(cudaMemcpyAsync(dst.data, src, dst.nbytes(), cudaMemcpyHostToDevice, stream_),
        "copy to device");
}

void CudaBackend::CopyToHost(void* dst, const Tensor& src) {
  DH_CHECK(src.contiguous(), "CopyToHost from a strided tensor {}", src.ShapeString());
  if (src.nbytes() == 0) return;
  Check(cudaMemcpyAsync(dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_),
        "copy to host");
  Check(cudaStreamSynchronize(stream_), "synchronize after copy to host");
}

void CudaBackend::Synchronize() { Check(cudaStreamSynchronize(stream_), "synchronize"); }

void CudaBackend::Embedding(const Weight& table, const Tensor& ids, Tensor out) {
  auto t = table.format == WeightFormat::kDense ? AsRows(table.data, false) : std::nullopt;
  auto o = AsRows(out);
  if (!t || !o || !IsI32Vector(ids) || ids.numel() != o->rows || t->cols != o->cols) {
    HostFallbackBackend::Embedding(table, ids, out);
    return;
  }
  Begin();
  Check(cuda::Embedding(*t, ids.as<const int32_t>(), ids.numel(), *o, stream_), "embedding");
  End("Embedding");
}

void CudaBackend::RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor out) {
  auto xr = AsRows(x), o = AsRows(out);
  if (!xr || !o || xr->rows != o->rows || xr->cols != o->cols || !IsVector(weight, xr->cols)) {
    HostFallbackBackend::RmsNorm(x, weight, eps, out);
    return;
  }
  Begin();
  Check(cuda::RmsNorm(*xr, weight.data, *ElemOf(weight.dtype), eps, *o, stream_), "rmsnorm");
  End("RmsNorm");
}

void CudaBackend::AddRmsNorm(Tensor residual, const Tensor& x, const Tensor& weight, float eps,
                             Tensor out) {
  auto r = AsRows(residual), xr = AsRows(x), o = AsRows(out);
  if (!r || !xr || !o || xr->rows != o->rows || xr->cols != o->cols || r->rows != xr->rows ||
      r->cols != xr->cols || !IsVector(weight, xr->cols)) {
    HostFallbackBackend::AddRmsNorm(residual, x, weight, eps, out);
    return;
  }
  Begin();
  Check(cuda::AddRmsNorm(*r, *xr, weight.data, *ElemOf(weight.dtype), eps, *o, stream_),
        "add_rmsnorm");
  End("AddRmsNorm");
}

void CudaBackend::MatMul(const Tensor& x, const Weight& w, const Tensor& bias, Tensor out) {
  auto xr = AsRows(x), o = AsRows(out);
  auto wr = w.format == WeightFormat::kDense && w.perm.empty() ? AsRows(w.data, false)
                                                                : std::nullopt;
  const bool bias_ok = bias.empty() || IsVector(bias, w.rows);
  if (!xr || !o || !wr || !bias_ok || wr->rows != w.rows || wr->cols != xr->cols ||
      o->rows != xr->rows || o->cols != w.rows || xr->cols > INT32_MAX || w.rows > INT32_MAX ||
      xr->rows > INT32_MAX) {
    HostFallbackBackend::MatMul(x, w, bias, out);
    return;
  }
  const void* b = bias.empty() ? nullptr : bias.data;
  DenseMatMul(*xr, *wr, b, bias.empty() ? 0 : *ElemOf(bias.dtype), *o, false);
}

void CudaBackend::DenseMatMul(const cuda::Rows& xr, const cuda::Rows& wr, const void* b,
                              int belem, const cuda::Rows& o, bool batched) {
  const int M = static_cast<int>(xr.rows), N = static_cast<int>(wr.rows),
            K = static_cast<int>(xr.cols);
  const bool f32 = wr.elem == cuda::kElemF32;
  if (M <= cuda::kMaxGemvRows) {
    Begin();
    Check(cuda::Gemv(xr, wr, b, belem, o, stream_), "gemv");
    End(batched ? (f32 ? "BatchedMatMul gemv f32" : "BatchedMatMul gemv 16-bit")
                : (f32 ? "MatMul gemv f32" : "MatMul gemv 16-bit"));
    return;
  }
  Begin();
  const float one = 1.0f, zero = 0.0f;
  // Row-major out[M, N] = x[M, K] w[N, K]^T is column-major out^T = w^T(op T) x^T.
  const auto sgemm = [&](const float* w, int rows, int ldw, float* out) {
    CheckBlas(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, rows, M, K, &one, w, ldw,
                          static_cast<const float*>(xr.data), static_cast<int>(xr.stride), &zero,
                          out, static_cast<int>(o.stride)),
              "sgemm");
  };
  if (f32) {
    sgemm(static_cast<const float*>(wr.data), N, static_cast<int>(wr.stride),
          static_cast<float*>(o.data));
  } else if (wr.elem == cuda::kElemBF16) {
    // x = x0 + x1 + x2 in bf16 parts: three tensor-core passes with f32 sums give the products
    // of x itself, where one pass over bf16(x) would round the activations (~2^-9 relative). The
    // weights are read three times: stacking the parts as rows of one GEMM would read them once
    // (not yet measured on a GPU).
    constexpr int kParts = 3;
    const size_t part = static_cast<size_t>(M) * K;
    auto* xs = static_cast<uint16_t*>(Scratch(3, kParts * part * 2));
    Check(cuda::SplitBf16(xr, xs, kParts, stream_), "split activations");
    for (int p = 0; p < kParts; ++p) {
      CheckBlas(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, wr.data,
                             CUDA_R_16BF, static_cast<int>(wr.stride), xs + p * part, CUDA_R_16BF,
                             K, p == 0 ? &zero : &one, o.data, CUDA_R_32F,
                             static_cast<int>(o.stride), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                "gemm");
    }
  } else {
    // f16's range is too narrow to split activations into: widen the weight rows to f32, at most
    // 64 MiB at a time.
    const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(N, (int64_t{16} << 20) / K));
    auto* wf = static_cast<float*>(Scratch(4, static_cast<size_t>(chunk * K) * sizeof(float)));
    for (int64_t n0 = 0; n0 < N; n0 += chunk) {
      cuda::Rows part = wr;
      part.data = static_cast<char*>(wr.data) + n0 * wr.stride * 2;  // f16: 2 bytes
      part.rows = std::min<int64_t>(chunk, N - n0);
      Check(cuda::WidenRows(part, wf, stream_), "widen weights");
      sgemm(wf, static_cast<int>(part.rows), K, static_cast<float*>(o.data) + n0);
    }
  }
  if (b != nullptr) Check(cuda::AddBias(o, b, belem, stream_), "bias");
  End(batched ? (f32 ? "BatchedMatMul cublas f32" : "BatchedMatMul cublas 16-bit")
              : (f32 ? "MatMul cublas f32" : "MatMul cublas 16-bit"));
}

// Per head, the dense MatMul on strided views of x and out (MLA's absorbed projections).
void CudaBackend::BatchedMatMul(const Tensor& x, std::span<const Weight> w, Tensor out) {
  bool ok = x.ndim == 3 && out.ndim == 3 && x.dtype == DType::kF32 &&
            out.dtype == DType::kF32 && x.stride[2] == 1 && out.stride[2] == 1 &&
            x.shape[0] == out.shape[0] && static_cast<int64_t>(w.size()) <= x.shape[1] &&
            static_cast<int64_t>(w.size()) <= out.shape[1] && x.shape[0] <= INT32_MAX &&
            x.shape[2] <= INT32_MAX && out.shape[2] <= INT32_MAX && x.stride[0] <= INT32_MAX &&
            out.stride[0] <= INT32_MAX && x.stride[0] >= 0 && out.stride[0] >= 0 &&
            x.stride[1] >= 0 && out.stride[1] >= 0;
  std::vector<cuda::Rows> ws;
  for (size_t h = 0; ok && h < w.size(); ++h) {
    auto wr = w[h].format == WeightFormat::kDense && w[h].perm.empty()
                  ? AsRows(w[h].data, false) : std::nullopt;
    ok = wr && wr->rows == w[h].rows && wr->cols == x.shape[2] && wr->rows == out.shape[2];
    if (ok) ws.push_back(*wr);
  }
  if (!ok) {
    HostFallbackBackend::BatchedMatMul(x, w, out);
    return;
  }
  for (size_t h = 0; h < ws.size(); ++h) {
    cuda::Rows xh{static_cast<float*>(x.data) + h * x.stride[1], cuda::kElemF32, x.shape[0],
                  x.shape[2], x.shape[0] > 1 ? x.stride[0] : x.shape[2]};
    cuda::Rows oh{static_cast<float*>(out.data) + h * out.stride[1], cuda::kElemF32,
                  out.shape[0], out.shape[2], out.shape[0] > 1 ? out.stride[0] : out.shape[2]};
    DenseMatMul(xh, ws[h], nullptr, 0, oh, true);
  }
}

void CudaBackend::Rope(Tensor x, const Tensor& positions, const RopeParams& p) {
  auto xv = AsView(x);
  const int half = p.rot_dim / 2;
  if (!xv || x.ndim != 3 || x.dtype != DType::kF32 || !IsI32Vector(positions) ||
      positions.numel() != x.shape[0] || p.inv_freq.dtype != DType::kF32 ||
      !IsVector(p.inv_freq, half) || p.rot_dim % 2 != 0 || p.offset < 0 ||
      p.offset + p.rot_dim > x.shape[2]) {
    HostFallbackBackend::Rope(x, positions, p);
    return;
  }
  cuda::RopeArgs a;
  a.half_style = p.style == RopeStyle::kHalf ? 1 : 0;
  a.offset = p.offset;
  a.rot_dim = p.rot_dim;
  a.attention_factor = p.attention_factor;
  Begin();
  Check(cuda::Rope(*xv, positions.as<const int32_t>(), p.inv_freq.as<const float>(), a, stream_),
        "rope");
  End("Rope");
}

// Quantized KV caches (f8e4m3, i8 with scales) have no device kernel yet: they run on the host
// fallback. f32, bf16 and f16 caches are native.
void CudaBackend::KvWrite(const Tensor& k, const Tensor& v, KvCacheView k_cache_view,
                          KvCacheView v_cache_view, const Tensor& slot_mapping) {
  const Tensor& k_cache = k_cache_view.data;
  const Tensor& v_cache = v_cache_view.data;
  auto shapes_ok = [](const Tensor& src, const Tensor& cache) {
    return src.ndim == 3 && cache.ndim == 3 && src.shape[1] == cache.shape[1] &&
           src.shape[2] == cache.shape[2] && AsView(src) && AsView(cache);
  };
  if (k_cache_view.quantized() || v_cache_view.quantized() || !IsI32Vector(slot_mapping) ||
      slot_mapping.numel() != k.shape[0] || !shapes_ok(k, k_cache) ||
      (!v.empty() && (!shapes_ok(v, v_cache) || v.shape[0] != k.shape[0]))) {
    HostFallbackBackend::KvWrite(k, v, k_cache_view, v_cache_view, slot_mapping);
    return;
  }
  Begin();
  Check(cuda::KvWrite(*AsView(k), *AsView(k_cache), slot_mapping.as<const int32_t>(), stream_),
        "kv write");
  if (!v.empty()) {
    Check(cuda::KvWrite(*AsView(v), *AsView(v_cache), slot_mapping.as<const int32_t>(), stream_),
          "kv write");
  }
  End("KvWrite");
}

void CudaBackend::KvGather(const KvCacheView& cache, const Tensor& slots, Tensor out) {
  const Tensor& c = cache.data;
  if (cache.quantized() || c.ndim != 3 || !c.contiguous() || out.ndim != 3 || !out.contiguous()) {
    HostFallbackBackend::KvGather(cache, slots, out);
    return;
  }
  GatherRows(c.Reshape({c.shape[0], c.shape[1] * c.shape[2]}), slots,
             out.Reshape({out.shape[0], out.shape[1] * out.shape[2]}));
}

void CudaBackend::Attention(const Tensor& q, const KvCacheView& k_cache_view,
                            const KvCacheView& v_cache_view, const AttentionMeta& meta,
                            float scale, Tensor out) {
  const Tensor& k_cache = k_cache_view.data;
  const Tensor& v_cache = v_cache_view.data;
  const bool shapes = !k_cache_view.quantized() && !v_cache_view.quantized() &&
                      q.ndim == 3 && k_cache.ndim == 3 && v_cache.ndim == 3 && out.ndim == 3 &&
                      q.dtype == DType::kF32 && out.dtype == DType::kF32 && k_cache.shape[1] > 0 &&
                      q.shape[1] % k_cache.shape[1] == 0 && v_cache.shape[1] == k_cache.shape[1] &&
                      k_cache.shape[2] == q.shape[2] && out.shape[0] == q.shape[0] &&
                      out.shape[1] == q.shape[1] && out.shape[2] == v_cache.shape[2];
  const bool meta_ok = IsI32Vector(meta.query_start) && IsI32Vector(meta.seq_lens) &&
                       !meta.block_tables.empty() && meta.block_tables.dtype == DType::kI32 &&
                       meta.query_start.numel() == meta.num_seqs + 1 &&
                       meta.num_tokens == q.shape[0];
  auto qv = AsView(q), kv = AsView(k_cache), vv = AsView(v_cache), ov = AsView(out);
  if (!shapes || !meta_ok || !qv || !kv || !vv || !ov || q.shape[2] > cuda::kMaxAttentionDk ||
      v_cache.shape[2] > cuda::kMaxAttentionDv) {
    HostFallbackBackend::Attention(q, k_cache_view, v_cache_view, meta, scale, out);
    return;
  }
  cuda::AttentionArgs a;
  a.num_seqs = meta.num_seqs;
  a.num_tokens = meta.num_tokens;
  a.block_size = meta.block_size;
  a.block_table_stride = meta.block_tables.ndim >= 2 ? meta.block_tables.stride[0]
                                                     : meta.max_blocks_per_seq;
  a.query_start = meta.query_start.as<const int32_t>();
  a.seq_lens = meta.seq_lens.as<const int32_t>();
  a.block_tables = meta.block_tables.as<const int32_t>();
  a.scale = scale;
  Begin();
  Check(cuda::Attention(*qv, *kv, *vv, *ov, a, stream_), "attention");
  End("Attention");
}

void CudaBackend::SiluMul(const Tensor& gate, const Tensor& up, Tensor out) {
  auto g = AsRows(gate), u = AsRows(up), o = AsRows(out);
  if (!g || !u || !o || g->rows != o->rows || u->rows != o->rows || g->cols != o->cols ||
      u->cols != o->cols) {
    HostFallbackBackend::SiluMul(gate, up, out);
    return;
  }
  Begin();
  Check(cuda::SiluMul(*g, *u, *o, stream_), "silu_mul");
  End("SiluMul");
}

void CudaBackend::Add(const Tensor& a, const Tensor& b, Tensor out) {
  auto ar = AsRows(a), br = AsRows(b), o = AsRows(out);
  if (!ar || !br || !o || ar->rows != o->rows || br->rows != o->rows || ar->cols != o->cols ||
      br->cols != o->cols) {
    HostFallbackBackend::Add(a, b, out);
    return;
  }
  Begin();
  Check(cuda::Add(*ar, *br, *o, stream_), "add");
  End("Add");
}

void CudaBackend::Copy(const Tensor& src, Tensor dst) {
  bool same_shape = src.ndim == dst.ndim;
  for (int i = 0; same_shape && i < src.ndim; ++i) same_shape = src.shape[i] == dst.shape[i];
  const bool raw = src.dtype == dst.dtype;
  auto sv = AsView(src, !raw), dv = AsView(dst, !raw);
  if (!same_shape || !sv || !dv) {
    HostFallbackBackend::Copy(src, dst);
    return;
  }
  Begin();
  Check(cuda::Copy(*sv, *dv, raw, static_cast<int>(DTypeSize(src.dtype)), stream_), "copy");
  End("Copy");
}

void CudaBackend::GatherRows(const Tensor& x, const Tensor& rows, Tensor out) {
  auto xr = AsRows(x), o = AsRows(out);
  if (!xr || !o || !IsI32Vector(rows) || rows.numel() != o->rows || xr->cols != o->cols) {
    HostFallbackBackend::GatherRows(x, rows, out);
    return;
  }
  Begin();
  Check(cuda::GatherRows(*xr, rows.as<const int32_t>(), rows.numel(), *o, stream_), "gather");
  End("GatherRows");
}

void CudaBackend::MoeGate(const Tensor& logits, const Tensor& bias, const MoeGateParams& p,
                          Tensor topk_ids, Tensor topk_weights) {
  auto l = AsRows(logits);
  const int E = l ? static_cast<int>(l->cols) : 0;
  const bool grouped = p.method != TopkMethod::kGreedy;
  const bool noaux = p.method == TopkMethod::kNoauxTc;
  const bool ok = l && logits.ndim == 2 && E <= cuda::kMaxMoeExperts && p.top_k >= 1 &&
                  p.top_k <= E && p.top_k <= 32 && topk_ids.dtype == DType::kI32 &&
                  topk_ids.contiguous() && topk_weights.dtype == DType::kF32 &&
                  topk_weights.contiguous() && topk_ids.numel() == l->rows * p.top_k &&
                  topk_weights.numel() == l->rows * p.top_k &&
                  (!grouped || (p.n_group >= 1 && p.n_group <= 64 && E % p.n_group == 0 &&
                                p.topk_group >= 1 && p.topk_group <= p.n_group &&
                                p.top_k <= p.topk_group * (E / p.n_group))) &&
                  (!noaux || IsVector(bias, E));
  if (!ok) {
    HostFallbackBackend::MoeGate(logits, bias, p, topk_ids, topk_weights);
    return;
  }
  cuda::MoeGateArgs a;
  a.num_experts = E;
  a.top_k = p.top_k;
  a.n_group = grouped ? p.n_group : 1;
  a.topk_group = grouped ? p.topk_group : 1;
  a.softmax = p.scoring == ScoringFunc::kSoftmax ? 1 : 0;
  a.grouped = grouped ? 1 : 0;
  a.noaux_tc = noaux ? 1 : 0;
  a.norm_topk_prob = p.norm_topk_prob ? 1 : 0;
  a.routed_scaling_factor = p.routed_scaling_factor;
  Begin();
  Check(cuda::MoeGate(*l, noaux ? bias.data : nullptr, noaux ? *ElemOf(bias.dtype) : 0, a,
                      topk_ids.as<int32_t>(), topk_weights.as<float>(), stream_),
        "moe gate");
  End("MoeGate");
}

void CudaBackend::MoeExperts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                             std::span<const ExpertWeights> experts, Tensor out) {
  auto xr = AsRows(x), o = AsRows(out);
  if (!xr || !o || x.ndim != 2 || topk_ids.ndim != 2 || topk_ids.dtype != DType::kI32 ||
      !topk_ids.contiguous() || topk_weights.dtype != DType::kF32 || !topk_weights.contiguous() ||
      topk_ids.shape[0] != xr->rows || topk_weights.numel() != topk_ids.numel() ||
      o->rows != xr->rows || o->cols != xr->cols) {
    HostFallbackBackend::MoeExperts(x, topk_ids, topk_weights, experts, out);
    return;
  }
  const int64_t T = xr->rows, hidden = xr->cols, k = topk_ids.shape[1];
  // The router's choices, on the host, to group tokens per expert.
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  CopyToHost(ids.data(), topk_ids);
  std::vector<std::vector<int32_t>> routed(experts.size());
  for (int64_t pair = 0; pair < T * k; ++pair) {
    const int32_t e = ids[pair];
    if (e < 0) continue;
    DH_CHECK(static_cast<size_t>(e) < experts.size(), "expert id {} of {}", e, experts.size());
    routed[e].push_back(static_cast<int32_t>(pair));
  }
  // One upload: per expert its token rows, then its pair indices.
  std::vector<int32_t> lists;
  std::vector<size_t> starts(experts.size(), 0);
  int64_t max_n = 0, max_inter = 0;
  for (size_t e = 0; e < experts.size(); ++e) {
    if (routed[e].empty()) continue;
    starts[e] = lists.size();
    for (int32_t pair : routed[e]) lists.push_back(static_cast<int32_t>(pair / k));
    lists.insert(lists.end(), routed[e].begin(), routed[e].end());
    max_n = std::max<int64_t>(max_n, static_cast<int64_t>(routed[e].size()));
    max_inter = std::max<int64_t>(max_inter, experts[e].gate.rows);
  }
  auto* y = static_cast<float*>(Scratch(0, static_cast<size_t>(T * k * hidden) * sizeof(float)));
  if (!lists.empty()) {
    auto* dev_lists = static_cast<int32_t*>(Scratch(1, lists.size() * sizeof(int32_t)));
    CopyToDevice(Tensor(dev_lists, DType::kI32, {static_cast<int64_t>(lists.size())}),
                 lists.data());
    auto* work = static_cast<float*>(
        Scratch(2, static_cast<size_t>(max_n * (2 * hidden + 2 * max_inter)) * sizeof(float)));
    for (size_t e = 0; e < experts.size(); ++e) {
      if (routed[e].empty()) continue;
      const ExpertWeights& ew = experts[e];
      const int64_t n = static_cast<int64_t>(routed[e].size()), inter = ew.gate.rows;
      const Tensor rows_t(dev_lists + starts[e], DType::kI32, {n});
      const Tensor xs(work, DType::kF32, {n, hidden});
      const Tensor gate(work + n * hidden, DType::kF32, {n, inter});
      const Tensor up(work + n * (hidden + inter), DType::kF32, {n, inter});
      const Tensor ys(work + n * (hidden + 2 * inter), DType::kF32, {n, hidden});
      GatherRows(x, rows_t, xs);
      MatMul(xs, ew.gate, Tensor(), gate);
      MatMul(xs, ew.up, Tensor(), up);
      SiluMul(gate, up, gate);
      MatMul(gate, ew.down, Tensor(), ys);
      Begin();
      Check(cuda::ScatterRows(ys.as<const float>(), dev_lists + starts[e] + n, n, hidden, y,
                              stream_),
            "moe scatter");
      End("MoeExperts scatter");
    }
  }
  Begin();
  Check(cuda::MoeCombine(y, topk_ids.as<const int32_t>(), topk_weights.as<const float>(), T,
                         static_cast<int>(k), *o, stream_),
        "moe combine");
  End("MoeExperts combine");
}

}  // namespace dh
