# bench_ipc: the channel's latency and bandwidth against floors measured in the same run.
add_executable(bench_ipc ${CMAKE_CURRENT_LIST_DIR}/ipc.c)
target_link_libraries(bench_ipc PRIVATE moe_client moe_proto)
target_compile_definitions(bench_ipc PRIVATE MOE_SIDECAR_BIN="$<TARGET_FILE:moe-sidecar>")
add_dependencies(bench_ipc moe-sidecar)
