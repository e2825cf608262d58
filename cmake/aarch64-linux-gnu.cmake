# CMake toolchain for Debian's aarch64 cross compiler (g++-aarch64-linux-gnu) against the arm64
# multiarch -dev packages (libhwy-dev:arm64, libfmt-dev:arm64, libgtest-dev:arm64,
# libgmock-dev:arm64), which install under /usr/lib/aarch64-linux-gnu. Binaries run on an x86
# host under qemu-user (CMAKE_CROSSCOMPILING_EMULATOR). Used by scripts/test_arm.sh; docs/arm.md.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

# Programs come from the host. Libraries and CMake packages are searched in the cross sysroot and
# in the host's /usr, where CMAKE_LIBRARY_ARCHITECTURE points the per-architecture directories at
# /usr/lib/aarch64-linux-gnu (the arm64 multiarch packages). Headers are shared between
# architectures under /usr/include.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

# qemu-user runs the binaries with the arm64 multiarch loader and libraries that the -dev packages
# above pull in (libc6:arm64 puts /lib/ld-linux-aarch64.so.1 on the host). Do not pass
# `-L /usr/aarch64-linux-gnu`: that loader from the cross sysroot then meets the multiarch libc.so.6
# of another glibc build and the first pthread_create hangs (seen with Debian 12's packages).
find_program(DH_QEMU_AARCH64 qemu-aarch64)
if(DH_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${DH_QEMU_AARCH64})
endif()
