# Included by CMakeLists.txt when DH_KERNEL_TESTS_ONLY=ON, after the layers the kernels use: the
# kernel_tests binary alone, with no ctest registration. A cross build (cmake/aarch64-linux-gnu.cmake)
# cannot list its tests at build time without an emulator, and scripts/test_arm.sh runs the binary
# itself once per emulated CPU.
file(GLOB_RECURSE kernel_test_srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/kernels/*.cc)
add_executable(kernel_tests ${kernel_test_srcs})
target_include_directories(kernel_tests PRIVATE ${CMAKE_SOURCE_DIR}/tests)
target_link_libraries(kernel_tests PRIVATE ${DH_BACKENDS} hwy::hwy
                      GTest::gtest GTest::gtest_main GTest::gmock)
