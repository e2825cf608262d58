# The reference backend: plain loops on host memory, always built (the oracle of every test and
# the fallback of every other backend).
dh_backend(reference DEPS dh_backend)
