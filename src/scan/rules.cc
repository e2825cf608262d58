#include "scan/rules.h"

#include <cstring>

#include "base/check.h"

namespace dh::scan {
namespace {

constexpr Category D = Category::kDirect;
constexpr Category P = Category::kPartial;
constexpr Category C = Category::kCostly;
constexpr Severity E = Severity::kError;
constexpr Severity W = Severity::kWarning;
constexpr CountMode H = CountMode::kPerHit;
constexpr CountMode S = CountMode::kPerSymbol;
constexpr CountMode F = CountMode::kPerFile;
constexpr CountMode O = CountMode::kOnce;

struct RawRule {
  const char* id;
  const char* title;
  const char* family;
  Severity severity;
  CountMode count_mode;
  int weight;
  Category cat[kNumTargets];      // ascend, rocm, cpu
  const char* fix[kNumTargets];   // ascend, rocm, cpu
  const char* patterns;           // space-separated "kind:glob"
};

// The catalogue. Categories and replacements are per target: ascend (CANN / torch_npu /
// vllm-ascend), rocm (HIP / ROCm PyTorch), cpu (plain CPU PyTorch or deepharness itself).
const RawRule kRaw[] = {
    // ---------------------------------------------------------------- Python
    {"PY01", "Hard-coded CUDA device string", "python", E, H, 1, {D, D, D},
     {"resolve the device once from config; \"npu:N\" after import torch_npu",
      "unchanged on ROCm PyTorch (HIP devices answer to \"cuda\"); still prefer a config value",
      "resolve the device once from config (\"cpu\")"},
     "str:cuda str:cuda:# str:cuda:{*}"},
    {"PY02", ".cuda() calls and torch.cuda legacy tensor types", "python", E, H, 1, {D, D, D},
     {".to(device); torch.tensor(..., device=device)", "unchanged on ROCm PyTorch; prefer .to(device)",
      ".to(device) or drop the call"},
     "call:cuda py:torch.cuda.*Tensor"},
    {"PY03", "torch.cuda device query and control API", "python", E, H, 1, {D, D, D},
     {"torch.npu.* (same names) or torch.accelerator.* (PyTorch >= 2.6)",
      "unchanged on ROCm PyTorch (torch.cuda is HIP there)",
      "torch.accelerator.* or a small device facade that is a no-op on CPU"},
     "py:torch.cuda.is_available py:torch.cuda.device_count py:torch.cuda.set_device "
     "py:torch.cuda.current_device py:torch.cuda.synchronize py:torch.cuda.empty_cache "
     "py:torch.cuda.memory_* py:torch.cuda.max_memory_* py:torch.cuda.reset_* "
     "py:torch.cuda.mem_get_info py:torch.cuda.get_device_name py:torch.cuda.manual_seed* "
     "py:torch.cuda.Stream py:torch.cuda.Event py:torch.cuda.stream py:torch.cuda.current_stream "
     "py:torch.cuda.default_stream py:torch.cuda.device py:torch.cuda.ipc_collect py:torch.cuda.* "
     "py:torch.cuda"},
    {"PY04", "cuDNN / cuBLAS backend switches (TF32, benchmark)", "python", W, H, 1, {D, P, D},
     {"guard with the device type; NPU has no TF32, precision goes through torch.npu config",
      "cudnn flags map to MIOpen; TF32 does not exist on AMD GPUs",
      "guard with the device type or drop"},
     "py:torch.backends.cudnn* py:torch.backends.cuda* id:allow_tf32 "
     "py:torch.set_float32_matmul_precision"},
    {"PY05", "CUDA automatic mixed precision", "python", E, H, 1, {D, D, D},
     {"torch.amp.autocast(device_type=dev.type, dtype=torch.bfloat16); torch.amp.GradScaler(dev.type)",
      "unchanged on ROCm PyTorch; prefer torch.amp with device_type",
      "torch.amp.autocast(\"cpu\", dtype=torch.bfloat16); no GradScaler needed"},
     "py:torch.cuda.amp* py:apex.amp*"},
    {"PY06", "Compute-capability gating", "python", W, H, 2, {P, P, P},
     {"capability flags (supports_bf16, supports_fp8) resolved once per backend",
      "gfx architecture names instead of sm_XY; flags per backend",
      "CPU feature flags (AVX-512, BF16, AMX) instead of compute capability"},
     "py:torch.cuda.get_device_capability py:torch.cuda.get_device_properties str:sm_# "
     "id:multi_processor_count"},
    {"PY07", "NCCL process-group backend", "python", E, H, 1, {D, D, D},
     {"backend chosen per device: \"hccl\"", "unchanged: \"nccl\" is RCCL on ROCm PyTorch",
      "\"gloo\""},
     "str:nccl str:cpu:gloo,cuda:nccl py:torch.distributed.is_nccl_available "
     "py:torch.distributed.Backend.NCCL"},
    {"PY08", "NCCL-specific point-to-point and internals", "python", W, S, 3, {P, D, P},
     {"HCCL send/recv and batched P2P; check HCCL_BUFFSIZE and ordering",
      "RCCL behaves like NCCL; test P2P paths", "gloo P2P (slow) or a single process"},
     "py:torch.cuda.nccl* id:ProcessGroupNCCL py:torch.distributed._coalescing_manager"},
    {"PY09", "NCCL tuning environment variables", "python", W, S, 2, {P, D, D},
     {"HCCL_SOCKET_IFNAME, HCCL_IF_IP, HCCL_CONNECT_TIMEOUT, HCCL_BUFFSIZE; no 1:1 for IB/P2P knobs",
      "RCCL reads the same NCCL_* names", "drop them"},
     "str:NCCL_* w:NCCL_*"},
    {"PY10", "CUDA caching-allocator configuration", "python", W, S, 1, {P, D, D},
     {"PYTORCH_NPU_ALLOC_CONF (no stream-ordered async backend)",
      "PYTORCH_HIP_ALLOC_CONF (ROCm PyTorch also reads the CUDA name)", "drop it"},
     "str:PYTORCH_CUDA_ALLOC_CONF w:PYTORCH_CUDA_ALLOC_CONF str:backend:cudaMallocAsync "
     "py:torch.cuda.memory._record_memory_history py:torch.cuda.CUDAPluggableAllocator"},
    {"PY11", "CUDA graphs", "python", W, S, 5, {P, P, P},
     {"torch.npu.NPUGraph (ACL graph) or torchair behind a per-backend capture interface",
      "hipGraph through the same torch.cuda.graph API; capture limits differ",
      "drop capture on CPU (no launch overhead to hide)"},
     "py:torch.cuda.CUDAGraph py:torch.cuda.graph py:torch.cuda.graphs* "
     "py:torch.cuda.make_graphed_callables py:torch.cuda.graph_pool_handle "
     "str:reduce-overhead id:cudagraph_capture_sizes id:cuda_graph_sizes"},
    {"PY12", "torch.compile / Inductor / TorchScript assumptions", "python", W, S, 3, {P, P, P},
     {"make compile optional; torchair backend on NPU; transfer_to_npu turns jit.script off",
      "Inductor works on ROCm through Triton; retune max-autotune",
      "Inductor C++ backend on CPU; keep an eager path"},
     "py:torch.compile py:torch._inductor* str:inductor str:max-autotune py:torch.jit.script "
     "py:torch.jit.trace"},
    {"PY13", "FlashAttention / xFormers attention kernels", "python", E, S, 5, {P, P, C},
     {"torch_npu.npu_fusion_attention / npu_prompt_flash_attention; F.scaled_dot_product_attention",
      "the ROCm build of flash-attn (CK/Triton) or F.scaled_dot_product_attention",
      "F.scaled_dot_product_attention (or deepharness's paged attention)"},
     "py:flash_attn* py:xformers* req:flash-attn* req:xformers*"},
    {"PY14", "DeepSeek-class CUDA kernel libraries (FlashMLA, DeepGEMM, DeepEP, FlashInfer...)",
     "python", E, S, 13, {C, C, C},
     {"torch_npu MLA/MoE ops, ATB, HCCL all-to-all / MC2 in vllm-ascend or MindIE",
      "AITER / ROCm ports where they exist; otherwise new kernels",
      "CPU kernels behind the engine's kernel interface (deepharness backend/cpu)"},
     "py:flash_mla* py:deep_gemm* py:deep_ep* py:flashinfer* py:sgl_kernel* py:vllm._C* "
     "py:vllm._custom_ops* py:cutlass* py:marlin* req:flash-mla req:deep-gemm req:deep-ep "
     "req:flashinfer* req:sgl-kernel"},
    {"PY15", "Triton kernels", "python", E, S, 8, {C, P, C},
     {"triton-ascend with retuned block sizes, or torch ops / Ascend C",
      "Triton on ROCm: retune num_warps/BLOCK sizes for 64-wide wavefronts",
      "rewrite as torch ops or C++ kernels"},
     "py:triton*"},
    {"PY16", "CuPy, PyCUDA and Numba-CUDA", "python", E, S, 8, {C, P, P},
     {"torch ops on the device tensor or Ascend C custom ops", "CuPy's ROCm build; Numba has no ROCm target",
      "NumPy / Numba CPU"},
     "py:cupy* py:cupyx* py:numba.cuda* py:pycuda* req:cupy* req:pycuda"},
    {"PY17", "Low-level CUDA Python bindings and ctypes-loaded CUDA libraries", "python", E, S, 8,
     {C, P, C},
     {"AscendCL Python (pyACL) or torch_npu behind a runtime facade", "hip-python bindings",
      "remove; no device runtime on CPU"},
     "py:cuda.cudart py:cuda.cuda py:cuda.nvrtc py:cuda.bindings* str:libcudart* str:libcuda.so* "
     "str:libnvrtc* str:libcublas*"},
    {"PY18", "TensorRT family", "python", E, O, 20, {C, C, C},
     {"ATC (ONNX -> .om) + AscendCL, MindIE/ATB for LLMs, ONNX Runtime CANN EP",
      "MIGraphX or ONNX Runtime ROCm EP", "ONNX Runtime CPU EP or OpenVINO"},
     "py:tensorrt* py:torch_tensorrt* py:tensorrt_llm* str:CUDAExecutionProvider "
     "str:TensorrtExecutionProvider req:tensorrt* req:torch-tensorrt req:onnxruntime-gpu"},
    {"PY19", "CUDA-bound quantization libraries", "python", E, S, 8, {C, P, P},
     {"msModelSlim W8A8/W4A16 weights + --quantization ascend; re-validate accuracy",
      "bitsandbytes/AWQ ROCm builds where they exist; re-validate accuracy",
      "deepharness int8/int4 (compile) or PyTorch dynamic int8"},
     "py:bitsandbytes* id:BitsAndBytesConfig id:load_in_4bit id:load_in_8bit py:auto_gptq* "
     "py:awq* str:awq_marlin str:gptq_marlin str:marlin str:bitsandbytes str:modelopt "
     "req:bitsandbytes req:auto-gptq req:autoawq*"},
    {"PY20", "NVIDIA Apex", "python", W, S, 3, {P, P, P},
     {"torch.amp, torch.optim.AdamW(fused=...), nn.LayerNorm, torch DDP (FusedAdam is manual)",
      "the ROCm apex fork or the torch equivalents", "torch equivalents"},
     "py:apex* req:apex"},
    {"PY21", "DeepSpeed", "python", W, O, 5, {P, P, P},
     {"DS_ACCELERATOR=npu; replace CUDA-only deepspeed.ops", "DeepSpeed ROCm; check deepspeed.ops",
      "DS_ACCELERATOR=cpu; most deepspeed.ops are unavailable"},
     "py:deepspeed* req:deepspeed"},
    {"PY22", "NVML / nvidia-smi monitoring from code", "python", W, S, 3, {P, P, P},
     {"a backend-neutral telemetry interface; DCMI / npu-smi / torch.npu.mem_get_info",
      "amdsmi / rocm-smi", "psutil / /proc"},
     "py:pynvml* py:nvidia_smi* py:GPUtil* py:py3nvml* cmd:nvidia-smi req:pynvml "
     "req:nvidia-ml-py* req:gputil"},
    {"PY23", "CUDA device-selection and runtime environment variables", "python", W, H, 1, {D, D, D},
     {"ASCEND_RT_VISIBLE_DEVICES, ASCEND_LAUNCH_BLOCKING; drop the rest",
      "HIP_VISIBLE_DEVICES (ROCm also honours CUDA_VISIBLE_DEVICES)", "drop them"},
     "str:CUDA_VISIBLE_DEVICES str:CUDA_LAUNCH_BLOCKING str:CUDA_DEVICE_MAX_CONNECTIONS "
     "str:CUDA_MODULE_LOADING str:CUDA_HOME id:num_gpus"},
    {"PY24", "vLLM / SGLang CUDA-specific switches", "python", W, S, 3, {P, P, P},
     {"vllm-ascend picks its attention backend; --additional-config; bf16 KV cache",
      "vLLM ROCm backends (ROCM_FLASH, AITER)", "vLLM CPU backend or deepharness serve"},
     "str:VLLM_ATTENTION_BACKEND str:VLLM_USE_FLASHINFER_SAMPLER str:VLLM_ALL2ALL_BACKEND "
     "str:FLASH_ATTN str:FLASHINFER str:FLASHMLA str:TRITON_MLA str:CUTLASS_MLA w:VLLM_ATTENTION_BACKEND "
     "w:VLLM_USE_FLASHINFER_SAMPLER w:VLLM_ALL2ALL_BACKEND w:--kv-cache-dtype"},
    {"PY25", "Profiling with NVTX / CUDA profiler", "python", W, H, 1, {D, D, D},
     {"torch_npu.profiler (ProfilerActivity.NPU), msprof; record_function for ranges",
      "roctx ranges; torch.profiler works unchanged", "torch.profiler CPU activity"},
     "py:torch.cuda.nvtx* py:torch.cuda.profiler* py:nvtx* "
     "py:torch.profiler.ProfilerActivity.CUDA"},
    {"PY26", "Custom CUDA ops built from Python", "python", E, S, 13, {C, P, C},
     {"Ascend C kernel + OpPlugin / torch.library registration with the same op schema",
      "hipify the sources (torch does it for ROCm builds) and retest",
      "a C++ CPU implementation registered under the same op schema"},
     "py:torch.utils.cpp_extension.load py:torch.utils.cpp_extension.load_inline id:cuda_sources "
     "str:*.cu"},
    // ---------------------------------------------------------------- C / C++ / CUDA
    {"CC01", "CUDA runtime / driver headers", "c++", E, F, 3, {P, D, P},
     {"a runtime facade; AscendCL acl/acl.h", "hip/hip_runtime.h (hipify)",
      "a runtime facade with a host implementation"},
     "inc:cuda_runtime.h inc:cuda_runtime_api.h inc:cuda.h inc:driver_types.h "
     "inc:device_launch_parameters.h"},
    {"CC02", "CUDA memory API", "c++", E, H, 1, {D, D, D},
     {"aclrtMalloc / aclrtFree / aclrtMemcpy(Async) / aclrtMemset / aclrtMallocHost",
      "hipMalloc / hipFree / hipMemcpy* (hipify)", "malloc / memcpy / memset"},
     "c:cudaMalloc c:cudaFree c:cudaMemcpy c:cudaMemcpyAsync c:cudaMemcpy2D* c:cudaMemcpyPeer* "
     "c:cudaMemset c:cudaMemsetAsync c:cudaMallocHost c:cudaFreeHost c:cudaHostAlloc "
     "c:cudaMemcpyHostToDevice c:cudaMemcpyDeviceToHost c:cudaMemcpyDeviceToDevice"},
    {"CC03", "Stream-ordered allocator and memory pools", "c++", W, S, 5, {P, D, D},
     {"own caching allocator with per-stream free lists (no pool API in AscendCL)",
      "hipMallocAsync / hipMemPool*", "plain host allocation"},
     "c:cudaMallocAsync c:cudaFreeAsync c:cudaMemPool* c:cudaDeviceSetMemPool"},
    {"CC04", "CUDA streams, events, device selection and errors", "c++", E, H, 1, {D, D, D},
     {"aclrtCreateStream / aclrtSynchronizeStream / aclrtCreateEvent / aclrtSetDevice; aclError",
      "hipStream* / hipEvent* / hipSetDevice; hipError_t (hipify)",
      "a thread pool / no-op facade; plain error codes"},
     "c:cudaStream* c:cudaEvent* c:cudaDeviceSynchronize c:cudaSetDevice c:cudaGetDevice "
     "c:cudaGetDeviceCount c:cudaGetLastError c:cudaGetErrorString c:cudaPeekAtLastError "
     "c:cudaError_t c:cudaSuccess c:CUDA_CHECK c:cudaDeviceProp c:cudaGetDeviceProperties"},
    {"CC05", "CUDA Graph API", "c++", W, S, 5, {P, P, P},
     {"a backend graph-capture interface; ACL graph (capturable op limits differ)", "hipGraph*",
      "drop capture on CPU"},
     "c:cudaGraph* c:cudaStreamBeginCapture c:cudaStreamEndCapture"},
    {"CC06", "CUDA kernel definitions (SIMT)", "c++", E, S, 13, {C, P, C},
     {"Ascend C kernels (tile/queue model): a rewrite, keep a portable reference kernel",
      "HIP kernels: check warp-size-64 assumptions, shared memory and occupancy",
      "C++ loops / SIMD kernels (the reference implementation)"},
     "c:__global__ cu:__device__ cu:__shared__ c:__syncthreads c:threadIdx c:blockIdx c:blockDim "
     "c:gridDim cu:atomicAdd cu:atomicCAS cu:atomicMax"},
    {"CC07", "CUDA kernel launches", "c++", E, H, 3, {C, D, P},
     {"a backend kernel registry; aclnn ops where they exist (Ascend C <<<>>> means other dims)",
      "<<<>>> / hipLaunchKernelGGL work under HIP", "direct calls into a thread-pool loop"},
     "c:<<< c:cudaLaunchKernel c:cudaLaunchCooperativeKernel c:cudaFuncSetAttribute"},
    {"CC08", "PTX and warp-level intrinsics", "c++", E, S, 20, {C, C, C},
     {"hand-written Ascend C vector/cube code or library ops", "rewrite for 64-wide wavefronts",
      "SIMD intrinsics or plain loops"},
     "cu:asm c:__shfl_sync c:__shfl_xor_sync c:__shfl_down_sync c:__shfl_up_sync c:__ballot_sync "
     "c:__activemask c:cooperative_groups* c:nvcuda::wmma* c:wmma::* c:__ldg c:cuTensorMap*"},
    {"CC09", "cuBLAS / cuBLASLt", "c++", E, S, 3, {P, D, D},
     {"aclnnMatmul / aclnnBatchMatMul / aclnnGroupedMatmul (two-stage aclnn API) or ATB",
      "hipBLAS / hipBLASLt", "a CPU BLAS (OpenBLAS, oneDNN) or the engine's GEMM"},
     "inc:cublas*.h c:cublas*"},
    {"CC10", "cuDNN", "c++", E, S, 5, {P, P, P},
     {"aclnn conv / norm / activation ops", "MIOpen", "oneDNN"},
     "inc:cudnn*.h c:cudnn*"},
    {"CC11", "NCCL in C++", "c++", E, H, 2, {P, D, P},
     {"HCCL: HcclAllReduce / HcclAllGather / HcclSend / HcclCommInitRootInfo (no group calls 1:1)",
      "RCCL (same API)", "MPI or gloo"},
     "inc:nccl.h c:nccl*"},
    {"CC12", "TensorRT C++", "c++", E, O, 20, {C, C, C},
     {"ATC .om + aclmdlLoadFromFile / aclmdlExecute; plugins become Ascend C ops",
      "MIGraphX", "ONNX Runtime CPU or OpenVINO"},
     "inc:NvInfer*.h inc:NvOnnxParser*.h c:nvinfer1::* c:IPluginV2* c:IPluginV3* "
     "c:createInferBuilder"},
    {"CC13", "Thrust / CUB", "c++", E, S, 8, {C, D, P},
     {"aclnn sort / topk / cumsum / reduce ops; host STL for small data", "rocThrust / hipCUB",
      "std:: algorithms (parallel execution policies)"},
     "inc:thrust/* inc:cub/* c:thrust::* c:cub::*"},
    {"CC14", "Other CUDA math libraries (cuRAND, cuFFT, cuSPARSE, cuSOLVER)", "c++", E, S, 8,
     {C, D, P},
     {"aclnn random / FFT where available, else Ascend C", "hipRAND / hipFFT / hipSPARSE / hipSOLVER",
      "CPU libraries (FFTW, Eigen, LAPACK)"},
     "inc:curand*.h inc:cufft*.h inc:cusparse*.h inc:cusolver*.h c:curand* c:cufft* c:cusparse* "
     "c:cusolver*"},
    {"CC15", "Runtime compilation and the driver API (NVRTC, cuModule*, PTX)", "c++", E, S, 13,
     {C, P, C},
     {"precompiled Ascend C kernels / op packages (no PTX JIT)", "hiprtc / hipModule*",
      "ahead-of-time C++ kernels"},
     "inc:nvrtc.h c:nvrtc* c:cuModuleLoad* c:cuModuleGetFunction c:cuLaunchKernel c:cuCtxCreate* "
     "c:cuCtxSetCurrent c:cuDevicePrimaryCtx* c:cuInit"},
    {"CC16", "CUDA conditional compilation", "c++", W, H, 1, {P, D, D},
     {"own HAL_BACKEND_* macros; review each __CUDA_ARCH__ branch", "__HIP_PLATFORM_AMD__ / __HIPCC__",
      "own backend macros"},
     "c:__CUDACC__ c:__CUDA_ARCH__ c:CUDART_VERSION c:CUDA_VERSION c:USE_CUDA c:WITH_CUDA "
     "c:ENABLE_CUDA c:__NVCC__"},
    {"CC17", "CUDA scalar types (half, bfloat16, fp8)", "c++", W, H, 1, {P, D, P},
     {"own fp16/bf16 types; Ascend C half / bfloat16_t; FP8 usually needs a dequant path",
      "hip_fp16.h / hip_bf16.h", "own bit-exact fp16/bf16 conversions"},
     "inc:cuda_fp16.h inc:cuda_bf16.h inc:cuda_fp8.h c:__half c:__half2 c:half2 c:__nv_bfloat16* "
     "c:__nv_fp8_* c:__float2half* c:__half2float c:__float2bfloat16* c:__bfloat162float"},
    {"CC18", "Unified, IPC and peer memory; NVSHMEM", "c++", E, S, 8, {C, P, D},
     {"explicit copies; a new KV-transfer layer on CANN IPC / HCCL one-sided ops",
      "hipMallocManaged / hipIpc* (check XNACK)", "ordinary host memory"},
     "c:cudaMallocManaged c:cudaIpc* c:cudaHostRegister c:cudaDeviceEnablePeerAccess c:nvshmem*"},
    {"CC19", "PyTorch C++ extension CUDA glue", "c++", E, H, 2, {P, D, P},
     {"c10_npu::getCurrentNPUStream, c10_npu::NPUGuard, PrivateUse1; OpCommand / EXEC_NPU_CMD",
      "unchanged in a hipified ROCm PyTorch build", "drop guards; CPU dispatch key"},
     "c:at::cuda::* c:c10::cuda::* c:is_cuda c:kCUDA c:AT_CUDA_CHECK c:C10_CUDA_KERNEL_LAUNCH_CHECK "
     "c:C10_CUDA_CHECK"},
    // ---------------------------------------------------------------- build files
    {"BLD01", "CMake CUDA language and toolkit", "build", E, O, 3, {P, P, D},
     {"a backend option; CANN via ASCEND_HOME_PATH, link ascendcl / hccl / opapi",
      "enable_language(HIP), find_package(hip)", "drop the CUDA parts from the CPU build"},
     "w:find_package(CUDA* w:find_package(NCCL* w:find_package(CUDNN* w:find_package(TensorRT* "
     "w:enable_language(CUDA w:project(CUDA w:set_source_files_properties(CUDA w:CMAKE_CUDA_* "
     "w:cuda_add_library w:cuda_add_executable w:CUDA_SEPARABLE_COMPILATION"},
    {"BLD02", "Linking CUDA libraries", "build", E, S, 2, {P, P, D},
     {"backend-specific link lists (ascendcl, hccl, nnopbase)", "hip::host, roc::hipblas ...",
      "drop them"},
     "w:CUDA::* w:-lcudart* w:-lcublas* w:-lcudnn w:-lnccl w:-lnvinfer w:-lnvidia-ml w:-lcuda "
     "w:${CUDA_LIBRARIES} w:CUDA_LIBRARIES w:CUDA_CUBLAS_LIBRARIES"},
    {"BLD03", "nvcc flags and CUDA toolchain paths", "build", E, S, 2, {P, P, D},
     {"the CANN compiler with an SoC target; source ascend-toolkit/set_env.sh",
      "hipcc / amdclang++ with --offload-arch=gfx...", "drop them"},
     "w:-gencode* w:arch=compute_* w:code=sm_* w:sm_# w:sm_#a w:--use_fast_math w:-Xptxas* "
     "w:--expt-relaxed-constexpr w:--expt-extended-lambda w:CUDA_HOME w:/usr/local/cuda* w:nvcc "
     "w:TORCH_CUDA_ARCH_LIST w:CUDA_PATH w:CUDACXX"},
    {"BLD04", "setup.py / pyproject CUDA extensions", "build", E, S, 8, {C, D, P},
     {"torch_npu NpuExtension + an Ascend C op package; a C++ CPU fallback",
      "CUDAExtension is hipified automatically by ROCm PyTorch", "CppExtension with a CPU kernel"},
     "py:torch.utils.cpp_extension.CUDAExtension py:torch.utils.cpp_extension.CUDA_HOME "
     "py:torch.version.cuda"},
    {"BLD05", "CUDA-pinned dependencies", "build", E, H, 1, {D, D, D},
     {"per-target lock files: CPU torch + matching torch_npu, vllm + vllm-ascend, triton-ascend",
      "ROCm wheels (download.pytorch.org/whl/rocmX.Y), rocm variants of the packages",
      "CPU wheels (download.pytorch.org/whl/cpu); drop nvidia-* packages"},
     "req:*+cu#* req:*download.pytorch.org/whl/cu* req:nvidia-* req:cupy-cuda* req:triton "
     "req:vllm req:cudatoolkit* req:pytorch-cuda* req:nvidia::* w:*download.pytorch.org/whl/cu* "
     "w:cudatoolkit* w:pytorch-cuda* w:nvidia::*"},
    // ---------------------------------------------------------------- containers
    {"CTR01", "NVIDIA / CUDA base images", "container", W, O, 2, {P, P, D},
     {"a base-image build arg; CANN / vllm-ascend / MindIE images (often aarch64)",
      "rocm/pytorch or rocm/vllm images", "a plain distribution image"},
     "from:nvidia/cuda* from:nvcr.io/nvidia/* from:vllm/vllm-openai* from:pytorch/pytorch:*cuda* "
     "from:lmsysorg/sglang* w:nvidia/cuda:* w:nvcr.io/nvidia/*"},
    {"CTR02", "GPU container runtime flags", "container", E, H, 1, {D, D, D},
     {"--device /dev/davinciN, /dev/davinci_manager, /dev/devmm_svm, /dev/hisi_hdc + driver mounts",
      "--device /dev/kfd --device /dev/dri", "drop them"},
     "w:--gpus w:--gpus=* w:--runtime=nvidia w:nvidia-container-toolkit "
     "w:nvidia-container-runtime w:nvidia-docker* "
     "w:runtime:nvidia w:driver:nvidia w:capabilities:*gpu*"},
    {"CTR03", "NVIDIA container environment", "container", W, H, 1, {D, D, D},
     {"ASCEND_VISIBLE_DEVICES (runtime) / ASCEND_RT_VISIBLE_DEVICES (process)",
      "ROCR_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES", "drop them"},
     "w:NVIDIA_VISIBLE_DEVICES w:NVIDIA_DRIVER_CAPABILITIES w:NVIDIA_REQUIRE_CUDA "
     "str:NVIDIA_VISIBLE_DEVICES"},
    {"CTR04", "Kubernetes GPU scheduling", "container", E, S, 2, {P, P, D},
     {"huawei.com/Ascend910 (Ascend device plugin); vNPU instead of MIG",
      "amd.com/gpu (AMD device plugin)", "CPU / memory requests"},
     "w:nvidia.com/gpu* w:nvidia.com/mig-* w:runtimeClassName:nvidia w:gpu-operator*"},
    // ---------------------------------------------------------------- deployment
    {"OPS01", "nvidia-smi in scripts and probes", "deploy", W, S, 2, {P, P, P},
     {"npu-smi info (different output: one parser per backend)", "amd-smi / rocm-smi",
      "deepharness's own /metrics and health endpoint"},
     "w:nvidia-smi"},
    {"OPS02", "DCGM exporter metrics in dashboards and alerts", "deploy", W, S, 3, {P, P, P},
     {"NPU Exporter metrics (npu_chip_info_*), or the engine's own device metrics",
      "AMD device-metrics exporter", "node exporter + the engine's own metrics"},
     "w:DCGM_FI_*"},
    {"OPS03", "DCGM tooling", "deploy", W, O, 3, {P, P, D},
     {"ascend-dmi, NPU Exporter, npu-smi health", "ROCm Data Center tool (rdc)", "drop it"},
     "w:dcgmi w:nv-hostengine w:dcgm-exporter* w:dcgm"},
    {"OPS04", "Device visibility in launchers (shell, Slurm, systemd)", "deploy", W, H, 1, {D, D, D},
     {"ASCEND_RT_VISIBLE_DEVICES; site GRES for NPUs", "HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES",
      "taskset / numactl for CPU placement"},
     "w:CUDA_VISIBLE_DEVICES w:--gres=gpu* w:--gpus-per-node* w:--gpus-per-task* "
     "w:CUDA_LAUNCH_BLOCKING w:CUDA_DEVICE_MAX_CONNECTIONS"},
    {"OPS05", "NVIDIA profiling and diagnostic tools", "deploy", W, S, 2, {P, P, P},
     {"msprof / MindStudio Insight, hccl_test", "rocprof / omniperf, rccl-tests",
      "perf, deepharness bench"},
     "w:nsys w:ncu w:nvprof w:all_reduce_perf w:nccl-tests w:compute-sanitizer w:cuda-memcheck "
     "w:cuda-gdb"},
    {"OPS06", "GPU partitioning and sharing (MIG, MPS)", "deploy", W, O, 5, {C, P, D},
     {"vNPU (different granularity): redo capacity planning", "MI300 compute partitions",
      "drop it (CPU sharing is by cores)"},
     "w:CUDA_MPS_* w:nvidia-cuda-mps-control w:nvidia.com/mig*"},
};

int Specificity(std::string_view glob) {
  int n = 0;
  for (char c : glob) n += (c != '*' && c != '#');
  return n;
}

bool ParseKind(std::string_view k, PatternKind* kind) {
  static const struct {
    const char* name;
    PatternKind kind;
  } kKinds[] = {{"py", PatternKind::kPyName},   {"id", PatternKind::kPyIdent},
                {"call", PatternKind::kPyCall}, {"str", PatternKind::kPyString},
                {"cmd", PatternKind::kPyCommand},
                {"c", PatternKind::kC},         {"cu", PatternKind::kCuda},
                {"inc", PatternKind::kInclude}, {"w", PatternKind::kWord},
                {"req", PatternKind::kReq},     {"from", PatternKind::kFrom}};
  for (const auto& e : kKinds) {
    if (k == e.name) {
      *kind = e.kind;
      return true;
    }
  }
  return false;
}

std::vector<Rule> BuildRules() {
  std::vector<Rule> rules;
  for (const RawRule& r : kRaw) {
    Rule rule;
    rule.id = r.id;
    rule.title = r.title;
    rule.family = r.family;
    rule.severity = r.severity;
    rule.count_mode = r.count_mode;
    rule.weight = r.weight;
    for (int t = 0; t < kNumTargets; ++t) {
      rule.category[t] = r.cat[t];
      rule.replacement[t] = r.fix[t];
    }
    std::string_view rest = r.patterns;
    while (!rest.empty()) {
      const size_t sp = rest.find(' ');
      std::string_view item = rest.substr(0, sp);
      rest = sp == std::string_view::npos ? std::string_view() : rest.substr(sp + 1);
      if (item.empty()) continue;
      const size_t colon = item.find(':');
      DH_CHECK(colon != std::string_view::npos);
      Pattern p;
      DH_CHECK(ParseKind(item.substr(0, colon), &p.kind));
      p.glob = std::string(item.substr(colon + 1));
      p.specificity = Specificity(p.glob);
      rule.patterns.push_back(std::move(p));
    }
    rules.push_back(std::move(rule));
  }
  return rules;
}

}  // namespace

const std::vector<Rule>& Rules() {
  static const std::vector<Rule> rules = BuildRules();
  return rules;
}

const Rule* FindRule(std::string_view id) {
  for (const Rule& r : Rules()) {
    if (r.id == id) return &r;
  }
  return nullptr;
}

const char* TargetName(Target t) {
  switch (t) {
    case Target::kAscend: return "ascend";
    case Target::kRocm: return "rocm";
    case Target::kCpu: return "cpu";
  }
  return "?";
}

bool ParseTarget(std::string_view s, Target* t) {
  for (Target c : {Target::kAscend, Target::kRocm, Target::kCpu}) {
    if (s == TargetName(c)) {
      *t = c;
      return true;
    }
  }
  return false;
}

const char* CategoryName(Category c) {
  switch (c) {
    case Category::kDirect: return "direct";
    case Category::kPartial: return "partial";
    case Category::kCostly: return "costly";
  }
  return "?";
}

const char* SeverityName(Severity s) { return s == Severity::kError ? "error" : "warning"; }

const char* CountModeName(CountMode m) {
  switch (m) {
    case CountMode::kPerHit: return "per-hit";
    case CountMode::kPerSymbol: return "per-symbol";
    case CountMode::kPerFile: return "per-file";
    case CountMode::kOnce: return "once";
  }
  return "?";
}

double HoursForWeight(int weight) {
  // 1 ~ 10 min, 2 ~ 30 min, 3 ~ 2 h, 5 ~ 1 day, 8 ~ 2.5 days, 13 ~ 1 week, 20 ~ 2 weeks
  // (8-hour days, 5-day weeks).
  if (weight <= 1) return 1.0 / 6.0;
  if (weight <= 2) return 0.5;
  if (weight <= 3) return 2;
  if (weight <= 5) return 8;
  if (weight <= 8) return 20;
  if (weight <= 13) return 40;
  return 80;
}

}  // namespace dh::scan
