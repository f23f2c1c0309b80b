# bench_decode: a decode trace through the full path at 100/50/25% expert budgets, against the
# in-process all-resident floor and an mmap baseline under the same memory limit (cgroup).
add_executable(bench_decode ${CMAKE_CURRENT_LIST_DIR}/decode.c)
target_link_libraries(bench_decode PRIVATE moe_client moe_forward moe_gen moe_residency
                      moe_kernels ${MATH_LIB})
target_compile_definitions(bench_decode PRIVATE MOE_SIDECAR_BIN="$<TARGET_FILE:moe-sidecar>")
add_dependencies(bench_decode moe-sidecar)
