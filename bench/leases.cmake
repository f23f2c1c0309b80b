# bench_leases: expert leases (serve --leases) — resident and cold lease throughput against the
# pool mapping's memcpy rate and the disk's O_DIRECT rate, and moe_lease_deinterleave's rate.
if(TARGET moe_gen AND NOT MOE_FUZZ)
  add_executable(bench_leases ${CMAKE_CURRENT_LIST_DIR}/leases.c)
  target_link_libraries(bench_leases PRIVATE moe_client moe_residency moe_model moe_gen
                        moe_kernels PkgConfig::URING)
  target_compile_definitions(bench_leases PRIVATE MOE_SIDECAR_BIN="$<TARGET_FILE:moe-sidecar>")
  add_dependencies(bench_leases moe-sidecar)
endif()
