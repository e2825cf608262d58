// Writes a .safetensors file: tensors stored back to back in the given order, the JSON header
// padded with spaces to a multiple of 8 bytes. Used by tests, the tiny-checkpoint generator and
// the compile cache.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "tensor/tensor.h"

namespace dh {

// Every tensor must be contiguous and names must be unique.
Status WriteSafetensors(const std::string& path,
                        const std::vector<std::pair<std::string, Tensor>>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace dh
