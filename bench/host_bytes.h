// Weight buffers for the kernel microbenchmarks (bench_ops, bench_quant), taken from the memory
// the model's weights live in (base/host_memory.h: from 2 MiB up, 2 MiB-aligned and advised
// MADV_HUGEPAGE), so a kernel is timed on the pages a decode step reads. Weights in std::vector
// get malloc's 4 KiB pages, which cost the streaming kernels a TLB miss per 4 KiB and stop the
// hardware prefetchers at every page (bench/README.md "Benchmark weights in huge pages").
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "base/host_memory.h"

namespace dh {

class HostBytes {
 public:
  HostBytes() = default;
  explicit HostBytes(size_t size)
      : data_(static_cast<uint8_t*>(AllocateHostMemory(size))), size_(size) {
    if (size > 0 && data_ == nullptr) {
      std::fprintf(stderr, "bench: cannot allocate %zu bytes\n", size);
      std::exit(1);
    }
  }
  HostBytes(HostBytes&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  HostBytes& operator=(HostBytes&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  HostBytes(const HostBytes&) = delete;
  HostBytes& operator=(const HostBytes&) = delete;
  ~HostBytes() { FreeHostMemory(data_, size_); }

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace dh
