# Fuzz corpora replayed in the normal build (docs/reliability.md "Fuzzing"): every target of
# tests/fuzz/ registers into one `fuzz_replay` binary, and each tests/fuzz/corpus/<target>/ is a
# ctest `fuzz_replay_<target>`. The libFuzzer binaries themselves come from `make fuzz`
# (cmake/fuzz_only.cmake, clang).
file(GLOB fuzz_srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/fuzz/*.cc)
add_executable(fuzz_replay ${fuzz_srcs})
target_include_directories(fuzz_replay PRIVATE ${CMAKE_SOURCE_DIR}/tests)
target_compile_definitions(fuzz_replay PRIVATE DH_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
target_link_libraries(fuzz_replay PRIVATE dh_server dh_weights dh_grammar dh_tokenizer dh_chat
                      dh_io)
file(GLOB fuzz_corpora LIST_DIRECTORIES true CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/*)
foreach(dir ${fuzz_corpora})
  if(IS_DIRECTORY ${dir})
    get_filename_component(target ${dir} NAME)
    add_test(NAME fuzz_replay_${target} COMMAND fuzz_replay ${target} ${dir}
             WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
    set_tests_properties(fuzz_replay_${target} PROPERTIES TIMEOUT 300)
  endif()
endforeach()
