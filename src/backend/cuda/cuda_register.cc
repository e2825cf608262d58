// Registers the CUDA backend as "cuda" (creation fails with a message where no GPU is present).
#include "backend/cuda/cuda_backend.h"
#include "backend/registry.h"

namespace dh {
namespace {
DH_REGISTER_BACKEND("cuda", CudaBackend::Create);
}  // namespace
}  // namespace dh
