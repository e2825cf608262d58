// Tensor helpers that need no device.
#include "tensor/tensor.h"

#include <fmt/format.h>

namespace dh {

std::string Tensor::ShapeString() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return s + "]";
}

}  // namespace dh
