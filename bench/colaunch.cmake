# bench_colaunch: the timeline of an engine launched before its sidecar, and of a sidecar
# killed and restarted under it, against the warm-up and a warm FORWARD of the same run.
add_executable(bench_colaunch ${CMAKE_CURRENT_LIST_DIR}/colaunch.c)
target_link_libraries(bench_colaunch PRIVATE moe_client Threads::Threads)
target_compile_definitions(bench_colaunch PRIVATE MOE_SIDECAR_BIN="$<TARGET_FILE:moe-sidecar>"
                                                  MOE_GEN_BIN="$<TARGET_FILE:moe-gen>")
add_dependencies(bench_colaunch moe-sidecar moe-gen)
