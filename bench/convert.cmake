# bench_convert: the load-time MXFP4 Hugging Face -> GGUF conversion against memcpy, same run.
add_executable(bench_convert ${CMAKE_CURRENT_LIST_DIR}/convert.c)
target_link_libraries(bench_convert PRIVATE moe_kernels)
