# Sanitizer and fuzzing builds (tools/test.sh --sanitize address|thread, --fuzz). Each lives in
# its own build directory; the flags apply to everything we compile, third-party libraries
# (LibTorch, oneTBB, zstd) stay as shipped. Errors are fatal (-fno-sanitize-recover), so a report
# fails the test that triggered it.
if(PIPELINE_SANITIZE STREQUAL "address")
  add_compile_options(-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
  # ASan's instrumentation changes what GCC's flow analysis sees, and -Wmaybe-uninitialized then
  # fires inside libstdc++'s own headers (std::regex's automaton, GCC 12, in tests/test_live.cpp),
  # code the plain build compiles without the warning. The plain build keeps it as an error.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    add_compile_options(-Wno-maybe-uninitialized)
  endif()
elseif(PIPELINE_SANITIZE STREQUAL "thread")
  if(PIPELINE_WITH_TORCH)
    message(FATAL_ERROR "PIPELINE_SANITIZE=thread covers the torch-free parts: configure with -DPIPELINE_WITH_TORCH=OFF")
  endif()
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
  # GCC warns (-Wtsan) wherever std::atomic_thread_fence is inlined, because TSan does not model
  # fences; moodycamel's ConcurrentQueue (Debian's libconcurrentqueue-dev, behind the device
  # threads' hand-off) uses them. An unmodelled fence can only make TSan report a race that is
  # not there, never hide one, and the suite runs with zero reports; so the warning is not made
  # an error under PIPELINE_WERROR.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    add_compile_options(-Wno-tsan)
  endif()
elseif(NOT PIPELINE_SANITIZE STREQUAL "")
  message(FATAL_ERROR "PIPELINE_SANITIZE must be address, thread or empty, got '${PIPELINE_SANITIZE}'")
endif()

if(PIPELINE_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "PIPELINE_FUZZ needs clang (libFuzzer): configure with CC=clang CXX=clang++")
  endif()
  if(PIPELINE_WITH_TORCH)
    message(FATAL_ERROR "PIPELINE_FUZZ builds the torch-free parsers: configure with -DPIPELINE_WITH_TORCH=OFF")
  endif()
  # Coverage instrumentation for the libraries; the fuzz targets add the libFuzzer main.
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
endif()
