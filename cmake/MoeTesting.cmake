# Helpers every test folder uses, so that adding a test is one call.
#
# moe_add_test(NAME name SOURCES a.c b.c [LIBS x y] [LABELS l1 l2] [TIMEOUT s])
#   A Criterion test program registered with ctest. Labels select sanitizer variants:
#   "concurrent" tests also run under TSan, "slow" ones are skipped under ASan.
#   Criterion 2.4 cannot start under ThreadSanitizer ("Could not initialize inheritable
#   arena", Snaipe/Criterion#274): a concurrent scenario that TSan must see is a plain program
#   (add_executable + add_test, exit status 0 = pass) labelled "concurrent", never a Criterion
#   test with that label.
# moe_add_check(NAME name SOURCES a.c b.c [LIBS x y] [LABELS l1 l2] [TIMEOUT s] [SIDECAR])
#   A plain test program (exit status 0 = pass) registered with ctest, for what must also run
#   under TSan (label "concurrent"). SIDECAR: it runs the built moe-sidecar (MOE_SIDECAR_BIN).
#   Every check joins the target `checks`, which the TSan variant builds instead of everything.
# moe_add_fuzzer(NAME name SOURCES a.c [LIBS x y])
#   A libFuzzer target, built only with -DMOE_FUZZ=ON; its seed corpus lives in
#   tests/fuzz/corpus/<name>/ and scripts/test.sh runs it for a bounded time.
function(moe_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(MOE_FUZZ OR NOT CRITERION_FOUND)
    return()
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE PkgConfig::CRITERION ${T_LIBS})
  target_compile_definitions(${T_NAME} PRIVATE
    MOE_SIDECAR_BIN="$<TARGET_FILE:moe-sidecar>"
    MOE_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  if(MOE_TEST_HOOKS)
    target_compile_definitions(${T_NAME} PRIVATE
      MOE_SIDECAR_TESTHOOKS_BIN="$<TARGET_FILE:moe-sidecar-testhooks>")
  endif()
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} --jobs=1)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}")
endfunction()

function(moe_add_check)
  cmake_parse_arguments(C "SIDECAR" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(MOE_FUZZ)
    return()
  endif()
  add_executable(${C_NAME} ${C_SOURCES})
  target_link_libraries(${C_NAME} PRIVATE ${C_LIBS})
  if(C_SIDECAR)
    target_compile_definitions(${C_NAME} PRIVATE MOE_SIDECAR_BIN="$<TARGET_FILE:moe-sidecar>")
    add_dependencies(${C_NAME} moe-sidecar)
  endif()
  add_test(NAME ${C_NAME} COMMAND ${C_NAME})
  if(NOT C_TIMEOUT)
    set(C_TIMEOUT 300)
  endif()
  set_tests_properties(${C_NAME} PROPERTIES TIMEOUT ${C_TIMEOUT} LABELS "${C_LABELS}")
  set_property(GLOBAL APPEND PROPERTY MOE_CHECKS ${C_NAME})
endfunction()

function(moe_add_fuzzer)
  cmake_parse_arguments(F "" "NAME" "SOURCES;LIBS" ${ARGN})
  if(NOT MOE_FUZZ)
    return()
  endif()
  add_executable(${F_NAME} ${F_SOURCES})
  target_link_options(${F_NAME} PRIVATE -fsanitize=fuzzer)
  target_link_libraries(${F_NAME} PRIVATE ${F_LIBS})
  set_property(GLOBAL APPEND PROPERTY MOE_FUZZERS ${F_NAME})
endfunction()
