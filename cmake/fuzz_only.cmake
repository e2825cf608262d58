# DH_FUZZ_ONLY=ON (`make fuzz`, clang with -fsanitize=fuzzer-no-link,address,undefined in
# CMAKE_CXX_FLAGS): only the layers the parsers live in and one libFuzzer binary per target of
# tests/fuzz/ (fuzz_<target>). The server's request parsing is four files of src/server, built on
# their own here so the fuzz build does not compile the engine and the model.
dh_layer(dh_io src/io DEPS dh_tensor nlohmann_json::nlohmann_json)
dh_layer(dh_tokenizer src/tokenizer DEPS dh_io PkgConfig::PCRE2 PkgConfig::UTF8PROC
         nlohmann_json::nlohmann_json)
dh_layer(dh_chat src/chat DEPS dh_base nlohmann_json::nlohmann_json)
dh_layer(dh_weights src/weights DEPS dh_backend dh_io PkgConfig::XXHASH)
dh_layer(dh_grammar src/grammar DEPS dh_tokenizer nlohmann_json::nlohmann_json)
add_library(dh_fuzz_server STATIC src/server/request_body.cc src/server/openai_request.cc
            src/server/api_error.cc src/server/json_util.cc)
target_include_directories(dh_fuzz_server PUBLIC ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(dh_fuzz_server PUBLIC dh_io nlohmann_json::nlohmann_json)

if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  # Any other compiler (GCC: no libFuzzer): the corpus replayer over the same layers and the
  # thread-pool tests, for the sanitizer subset CI runs (scripts/sanitize_subset.sh).
  file(GLOB fuzz_srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/fuzz/*.cc)
  add_executable(fuzz_replay ${fuzz_srcs})
  target_include_directories(fuzz_replay PRIVATE ${CMAKE_SOURCE_DIR}/tests)
  target_compile_definitions(fuzz_replay PRIVATE DH_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  target_link_libraries(fuzz_replay PRIVATE dh_fuzz_server dh_weights dh_grammar dh_tokenizer
                        dh_chat dh_io)
  add_executable(san_thread_pool_tests ${CMAKE_SOURCE_DIR}/tests/unit/base/thread_pool_test.cc)
  target_link_libraries(san_thread_pool_tests PRIVATE dh_base GTest::gtest GTest::gtest_main)
  return()
endif()

file(GLOB fuzz_target_srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/fuzz/*_fuzz.cc)
add_custom_target(fuzz_all)
foreach(src ${fuzz_target_srcs})
  get_filename_component(stem ${src} NAME_WE)
  string(REGEX REPLACE "_fuzz$" "" target ${stem})
  add_executable(fuzz_${target} ${src} ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_support.cc)
  target_include_directories(fuzz_${target} PRIVATE ${CMAKE_SOURCE_DIR}/tests)
  target_compile_definitions(fuzz_${target} PRIVATE DH_LIBFUZZER=1
                             DH_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  target_link_options(fuzz_${target} PRIVATE -fsanitize=fuzzer)
  # Each target links only the layer it parses, so the cheap ones are ready first.
  set(libs dh_io)
  if(target MATCHES "^tokenizer")
    set(libs dh_tokenizer)
  elseif(target STREQUAL "jinja")
    set(libs dh_chat)
  elseif(target STREQUAL "chat_request")
    set(libs dh_fuzz_server)
  elseif(target STREQUAL "compile_cache")
    set(libs dh_weights)
  elseif(target STREQUAL "json_schema")
    set(libs dh_grammar)
  endif()
  target_link_libraries(fuzz_${target} PRIVATE ${libs})
  add_dependencies(fuzz_all fuzz_${target})
endforeach()
