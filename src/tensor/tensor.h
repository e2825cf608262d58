// Tensor: a non-owning view (pointer, dtype, shape, strides in elements) of memory that a Buffer,
// a mapped file or a host vector owns. Row-major; strides let a view pick columns out of a wider
// row (e.g. the latent part of an MLA cache entry) without copying.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "base/check.h"
#include "tensor/dtype.h"

namespace dh {

inline constexpr int kMaxDims = 4;

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> stride{};  // in elements

  Tensor() = default;
  Tensor(void* d, DType t, std::initializer_list<int64_t> dims) : data(d), dtype(t) {
    DH_CHECK(dims.size() <= kMaxDims);
    for (int64_t v : dims) shape[ndim++] = v;
    SetContiguousStrides();
  }
  template <typename Container>
  static Tensor FromDims(void* d, DType t, const Container& dims) {
    Tensor x;
    x.data = d;
    x.dtype = t;
    DH_CHECK(dims.size() <= kMaxDims, "too many dims: {}", dims.size());
    for (auto v : dims) x.shape[x.ndim++] = static_cast<int64_t>(v);
    x.SetContiguousStrides();
    return x;
  }

  void SetContiguousStrides() {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      stride[i] = s;
      s *= shape[i];
    }
  }
  bool empty() const { return data == nullptr; }
  int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype); }
  bool contiguous() const {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      if (shape[i] != 1 && stride[i] != s) return false;
      s *= shape[i];
    }
    return true;
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  // Rows [begin, begin + count) of the first dim.
  Tensor Slice0(int64_t begin, int64_t count) const {
    DH_CHECK(begin >= 0 && begin + count <= shape[0], "slice {}+{} of {}", begin, count, shape[0]);
    Tensor r = *this;
    r.data = static_cast<char*>(data) + begin * stride[0] * DTypeSize(dtype);
    r.shape[0] = count;
    return r;
  }
  // Elements [begin, begin + count) of dimension `d` (a strided view).
  Tensor Narrow(int d, int64_t begin, int64_t count) const {
    DH_CHECK(d >= 0 && d < ndim && begin >= 0 && begin + count <= shape[d], "narrow");
    Tensor r = *this;
    r.data = static_cast<char*>(data) + begin * stride[d] * static_cast<int64_t>(DTypeSize(dtype));
    r.shape[d] = count;
    return r;
  }
  // Index `i` of dimension `d`, that dimension dropped (a strided view, like torch.select).
  Tensor Select(int d, int64_t i) const {
    DH_CHECK(d >= 0 && d < ndim && i >= 0 && i < shape[d], "select {} of dim {}", i, d);
    Tensor r = Narrow(d, i, 1);
    for (int j = d; j + 1 < ndim; ++j) {
      r.shape[j] = r.shape[j + 1];
      r.stride[j] = r.stride[j + 1];
    }
    --r.ndim;
    r.shape[r.ndim] = r.stride[r.ndim] = 0;
    return r;
  }
  // A broadcast view: a new dimension `d` of `count` entries that all read this memory (stride
  // 0), like torch's unsqueeze(d).expand. Ops read such views where backend.h says so (Copy).
  Tensor Broadcast(int d, int64_t count) const {
    DH_CHECK(d >= 0 && d <= ndim && ndim < kMaxDims && count >= 0, "broadcast dim {}", d);
    Tensor r = *this;
    for (int j = ndim; j > d; --j) {
      r.shape[j] = r.shape[j - 1];
      r.stride[j] = r.stride[j - 1];
    }
    r.shape[d] = count;
    r.stride[d] = 0;
    ++r.ndim;
    return r;
  }
  // Same memory, new contiguous shape with the same element count.
  Tensor Reshape(std::initializer_list<int64_t> dims) const {
    DH_CHECK(contiguous(), "reshape of a strided view");
    Tensor r(data, dtype, dims);
    DH_CHECK(r.numel() == numel(), "reshape {} -> {} elements", numel(), r.numel());
    return r;
  }
  std::string ShapeString() const;
};

}  // namespace dh
