# The CPU backend: Highway kernels with runtime SIMD dispatch, always built (the default device).
dh_backend(cpu DEPS dh_backend_reference hwy::hwy)
# GCC rejects arrays of SVE vectors (sizeless types), which the register tiles of src/backend/cpu
# use, so aarch64 builds compile Highway's NEON target only unless DH_ARM_SVE=ON (docs/arm.md).
# PUBLIC: the tests must see the same target list as the kernels they dispatch to.
option(DH_ARM_SVE "aarch64: also compile Highway's SVE/SVE2 targets" OFF)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64)$" AND NOT DH_ARM_SVE)
  target_compile_definitions(dh_backend_cpu PUBLIC
                             "HWY_DISABLED_TARGETS=(HWY_SVE|HWY_SVE2|HWY_SVE_256|HWY_SVE2_128)")
endif()
# Rope and the KV cache formats match the reference bit for bit: no multiply-add may be fused.
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/rope_kv.cc PROPERTIES
                            COMPILE_OPTIONS -ffp-contract=off)
