# The reference backend: plain loops on host memory, always built (the oracle of every test and
# the fallback of every other backend).
dh_backend(reference DEPS dh_backend)
# The oracle rounds every product and sum on its own: where the baseline ISA has a fused
# multiply-add (aarch64), the compiler would otherwise contract some and not others.
target_compile_options(dh_backend_reference PRIVATE -ffp-contract=off)
