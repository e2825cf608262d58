// ReferenceBackend: host buffers and forwarding of every op to the plain loops of reference_ops.
// Every op names its kernel "reference" (kernel_note.h), so a backend that inherits an op from
// here is traced as running the reference loops without overriding it.
#include "backend/reference/reference_backend.h"

#include <cstdlib>
#include <cstring>

#include "backend/kernel_note.h"
#include "backend/reference/reference_ops.h"
#include "base/check.h"
#include "base/host_memory.h"

namespace dh {

HostBuffer::HostBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  data_ = AllocateHostMemory(bytes);
  DH_CHECK(data_ != nullptr, "out of host memory allocating {} bytes", bytes);
}

HostBuffer::~HostBuffer() { FreeHostMemory(data_, size_); }

ReferenceBackend::ReferenceBackend(const BackendOptions& options) : options_(options) {}

std::unique_ptr<Buffer> ReferenceBackend::Allocate(size_t bytes) {
  return std::make_unique<HostBuffer>(bytes);
}

void ReferenceBackend::CopyToDevice(const Tensor& dst, const void* src) {
  DH_CHECK(dst.contiguous(), "CopyToDevice into a strided tensor {}", dst.ShapeString());
  if (dst.nbytes() > 0) std::memcpy(dst.data, src, dst.nbytes());
}

void ReferenceBackend::CopyToHost(void* dst, const Tensor& src) {
  DH_CHECK(src.contiguous(), "CopyToHost from a strided tensor {}", src.ShapeString());
  if (src.nbytes() > 0) std::memcpy(dst, src.data, src.nbytes());
}

void ReferenceBackend::Embedding(const Weight& table, const Tensor& ids, Tensor out) {
  NoteKernel("reference");
  ref::Embedding(table, ids, out);
}
void ReferenceBackend::RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor out) {
  NoteKernel("reference");
  ref::RmsNorm(x, weight, eps, out);
}
void ReferenceBackend::AddRmsNorm(Tensor residual, const Tensor& x, const Tensor& weight,
                                  float eps, Tensor out) {
  NoteKernel("reference");
  ref::AddRmsNorm(residual, x, weight, eps, out);
}
void ReferenceBackend::MatMul(const Tensor& x, const Weight& w, const Tensor& bias, Tensor out) {
  NoteKernel("reference");
  ref::MatMul(x, w, bias, out);
}
void ReferenceBackend::BatchedMatMul(const Tensor& x, std::span<const Weight> w, Tensor out) {
  NoteKernel("reference");
  ref::BatchedMatMul(x, w, out);
}
void ReferenceBackend::Rope(Tensor x, const Tensor& positions, const RopeParams& p) {
  NoteKernel("reference");
  ref::Rope(x, positions, p);
}
void ReferenceBackend::KvWrite(const Tensor& k, const Tensor& v, KvCacheView k_cache,
                               KvCacheView v_cache, const Tensor& slot_mapping) {
  NoteKernel("reference");
  ref::KvWrite(k, v, k_cache, v_cache, slot_mapping);
}
void ReferenceBackend::Attention(const Tensor& q, const KvCacheView& k_cache,
                                 const KvCacheView& v_cache, const AttentionMeta& meta,
                                 float scale, Tensor out) {
  NoteKernel("reference");
  ref::Attention(q, k_cache, v_cache, meta, scale, out);
}
void ReferenceBackend::KvGather(const KvCacheView& cache, const Tensor& slots, Tensor out) {
  NoteKernel("reference");
  ref::KvGather(cache, slots, out);
}
void ReferenceBackend::SiluMul(const Tensor& gate, const Tensor& up, Tensor out) {
  NoteKernel("reference");
  ref::SiluMul(gate, up, out);
}
void ReferenceBackend::Add(const Tensor& a, const Tensor& b, Tensor out) {
  NoteKernel("reference");
  ref::Add(a, b, out);
}
void ReferenceBackend::Copy(const Tensor& src, Tensor dst) {
  NoteKernel("reference");
  ref::Copy(src, dst);
}
void ReferenceBackend::GatherRows(const Tensor& x, const Tensor& rows, Tensor out) {
  NoteKernel("reference");
  ref::GatherRows(x, rows, out);
}
void ReferenceBackend::MoeGate(const Tensor& logits, const Tensor& bias, const MoeGateParams& p,
                               Tensor topk_ids, Tensor topk_weights) {
  NoteKernel("reference");
  ref::MoeGate(logits, bias, p, topk_ids, topk_weights);
}
void ReferenceBackend::MoeExperts(const Tensor& x, const Tensor& topk_ids,
                                  const Tensor& topk_weights,
                                  std::span<const ExpertWeights> experts, Tensor out) {
  NoteKernel("reference");
  ref::MoeExperts(*this, x, topk_ids, topk_weights, experts, out);
}

}  // namespace dh
