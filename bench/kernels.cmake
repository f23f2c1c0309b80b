# bench_kernels: expert FFN throughput vs DRAM bandwidth and FMA peak measured in the same run
# (x86-64: its probes are AVX2). Run: build/bench/bench_kernels [--quick] [--json].
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$" AND NOT MOE_FUZZ)
  add_executable(bench_kernels ${CMAKE_CURRENT_LIST_DIR}/kernels.c)
  target_link_libraries(bench_kernels PRIVATE moe_kernels Threads::Threads)
  # --dots times the ISA's dot entry points directly (kernels_internal.h)
  target_include_directories(bench_kernels PRIVATE ${PROJECT_SOURCE_DIR}/kernels)
endif()
