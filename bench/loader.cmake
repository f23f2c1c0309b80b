# bench_loader: residency loader cold-load throughput vs a plain io_uring O_DIRECT read of the
# same bytes (bench/loader.c). Needs the generator (tools/, libmoe_gen).
if(TARGET moe_gen AND NOT MOE_FUZZ)
  add_executable(bench_loader ${CMAKE_CURRENT_LIST_DIR}/loader.c)
  target_link_libraries(bench_loader PRIVATE moe_residency moe_gen PkgConfig::URING)
endif()
