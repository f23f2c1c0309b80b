# bench_invariant: tokens/s of the batch-invariant FFN over the default, per format, at 1, 8,
# 64 and 512 tokens, both in one run. Run: build/bench/bench_invariant [--quick].
if(NOT MOE_FUZZ)
  add_executable(bench_invariant ${CMAKE_CURRENT_LIST_DIR}/invariant.c)
  target_link_libraries(bench_invariant PRIVATE moe_kernels ${MATH_LIB})
endif()
