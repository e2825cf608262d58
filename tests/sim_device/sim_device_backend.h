// SimDeviceBackend ("sim-device", registered in test binaries only): a deliberately partial
// backend that stands in for an accelerator, to test that the engine treats backend memory as
// device memory and that HostFallbackBackend runs every op it lacks.
//
// Device memory is simulated: Allocate() hands out addresses inside a reserved PROT_NONE range,
// and the bytes live at the same offset in a separate read-write "shadow" range. Host code that
// dereferences a device address therefore crashes (SIGSEGV) instead of silently working, exactly
// where a real GPU pointer would fail. The backend implements memory and MatMul for dense
// f32/bf16/f16 weights (the reference loop on the shadow bytes, as a device kernel would run on
// device memory); every other op goes through the host fallback.
#pragma once

#include <sys/mman.h>

#include <cstring>
#include <mutex>

#include "backend/reference/host_fallback.h"
#include "backend/reference/reference_ops.h"
#include "base/check.h"

namespace dh::test {

class SimDeviceBackend : public HostFallbackBackend {
 public:
  explicit SimDeviceBackend(const BackendOptions& o) : HostFallbackBackend(o) {}
  std::string name() const override { return "sim-device"; }
  std::string KernelTag() const override { return "sim"; }
  bool Supports(const OpDesc& op) const override {
    return op.op == OpKind::kMatMul && op.format == WeightFormat::kDense &&
           (op.dtype == DType::kF32 || op.dtype == DType::kBF16 || op.dtype == DType::kF16);
  }

  std::unique_ptr<Buffer> Allocate(size_t bytes) override {
    return std::make_unique<SimBuffer>(bytes, ForgetHostCopiesHook());
  }
  void CopyToDevice(const Tensor& dst, const void* src) override {
    DH_CHECK(dst.contiguous(), "CopyToDevice into a strided tensor");
    if (dst.nbytes() > 0) std::memcpy(Shadow(dst.data, dst.nbytes()), src, dst.nbytes());
  }
  void CopyToHost(void* dst, const Tensor& src) override {
    DH_CHECK(src.contiguous(), "CopyToHost from a strided tensor");
    if (src.nbytes() > 0) std::memcpy(dst, Shadow(src.data, src.nbytes()), src.nbytes());
  }

  void MatMul(const Tensor& x, const Weight& w, const Tensor& bias, Tensor out) override {
    if (!Supports({OpKind::kMatMul, w.format, w.data.dtype}) || !w.perm.empty()) {
      HostFallbackBackend::MatMul(x, w, bias, out);
      return;
    }
    Weight dw = w;
    dw.data = OnShadow(w.data);
    ref::MatMul(OnShadow(x), dw, OnShadow(bias), OnShadow(out));
  }

 protected:
  bool IsDeviceMemory(const void* p) const override {
    const char* c = static_cast<const char*>(p);
    return c >= space().device && c < space().device + Space::kBytes;
  }

 private:
  // One process-wide pair of ranges: `device` (PROT_NONE) and `shadow` (read-write), bump
  // allocated; freed ranges give their shadow pages back to the OS.
  struct Space {
    static constexpr size_t kBytes = size_t{16} << 30;  // virtual only (MAP_NORESERVE)
    char* device = nullptr;
    char* shadow = nullptr;
    size_t used = 0;
    std::mutex mu;
    Space() {
      void* d = mmap(nullptr, kBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      void* s = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      DH_CHECK(d != MAP_FAILED && s != MAP_FAILED, "sim-device: cannot reserve address space");
      device = static_cast<char*>(d);
      shadow = static_cast<char*>(s);
    }
  };
  static Space& space() {
    static Space* s = new Space();  // never unmapped: buffers may outlive static destruction
    return *s;
  }
  static void* Shadow(const void* p, size_t n) {
    Space& s = space();
    const char* c = static_cast<const char*>(p);
    DH_CHECK(c >= s.device && c + n <= s.device + s.used,
             "sim-device: {} is not device memory of this backend", p);
    return s.shadow + (c - s.device);
  }
  static Tensor OnShadow(const Tensor& t) {
    if (t.empty()) return t;
    Tensor r = t;
    r.data = Shadow(t.data, 1);
    return r;
  }

  class SimBuffer : public Buffer {
   public:
    SimBuffer(size_t bytes, std::function<void(const void*, size_t)> forget)
        : size_(bytes), forget_(std::move(forget)) {
      Space& s = space();
      std::lock_guard<std::mutex> lock(s.mu);
      const size_t rounded = (bytes + 4095) / 4096 * 4096;
      DH_CHECK(s.used + rounded <= Space::kBytes, "sim-device: out of simulated memory");
      data_ = s.device + s.used;
      s.used += rounded;
    }
    ~SimBuffer() override {
      forget_(data_, size_);
      Space& s = space();
      const size_t rounded = (size_ + 4095) / 4096 * 4096;
      if (rounded > 0) madvise(s.shadow + (data_ - s.device), rounded, MADV_DONTNEED);
    }
    void* data() override { return data_; }
    size_t size() const override { return size_; }

   private:
    char* data_ = nullptr;
    size_t size_ = 0;
    std::function<void(const void*, size_t)> forget_;
  };
};

}  // namespace dh::test
