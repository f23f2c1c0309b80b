# Debian packages of the install components, split the way Debian splits a daemon and its
# library (`cpack -G DEB` in the build directory, configured with -DCMAKE_INSTALL_PREFIX=/usr):
#
#   component  package             holds
#   daemon     moe-sidecar         moe-sidecar, moe-gen, the systemd units, operations.md, engines.md
#   runtime    libmoe-client1      libmoe_client.so.1 (the soname link and the file it names)
#   dev        libmoe-client-dev   the headers, libmoe_client.a, the .so link, moe-client.pc,
#                                  the MoeClient CMake package; depends on libmoe-client1 (= version)
#
# Each package's dependencies on shared libraries are computed by dpkg-shlibdeps from what its
# binaries link (the daemon's liburing, libbpf, hwloc, libnuma, …), never written here, and
# libmoe-client1 ships a shlibs file for the packages built against it. Each package carries
# /usr/share/doc/<package>/{copyright,changelog.Debian.gz} (components' EXCLUDE_FROM_ALL
# files: packages only, not `cmake --install`). tests/install/test_packages.sh checks the
# result with dpkg-deb and lintian, then runs what it extracted.
# Only a build configured with the prefix /usr makes them: cpack refuses others
# (debian/CPackProjectConfig.cmake), since the units name the daemon by its configured path.

set(MOE_DEB_SOURCE moe-sidecar)
set(MOE_DEB_RELEASE 1)
set(MOE_DEB_VERSION ${PROJECT_VERSION}-${MOE_DEB_RELEASE})
set(MOE_DEB_MAINTAINER
    "moe-sidecar maintainers <maintainers@users.noreply.a-seed-1f676824.example>"
    CACHE STRING "Maintainer field of the Debian packages")

set(moe_deb_packages moe-sidecar libmoe-client1 libmoe-client-dev)
set(moe_deb_components daemon runtime dev)

# changelog.Debian.gz: one entry for this version, dated by SOURCE_DATE_EPOCH when set
# (string(TIMESTAMP) honours it), compressed without a timestamp (gzip -n) as lintian wants.
string(TIMESTAMP MOE_DEB_DATE "%a, %d %b %Y %H:%M:%S +0000" UTC)
set(moe_deb_dir ${PROJECT_BINARY_DIR}/debian)
configure_file(${CMAKE_CURRENT_LIST_DIR}/debian/changelog.in ${moe_deb_dir}/changelog.Debian @ONLY)
find_program(MOE_GZIP gzip)
if(MOE_GZIP)
  execute_process(COMMAND ${MOE_GZIP} -9 -n -c ${moe_deb_dir}/changelog.Debian
                  OUTPUT_FILE ${moe_deb_dir}/changelog.Debian.gz RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "gzip of ${moe_deb_dir}/changelog.Debian failed")
  endif()
  foreach(pkg comp IN ZIP_LISTS moe_deb_packages moe_deb_components)
    install(FILES ${CMAKE_CURRENT_LIST_DIR}/debian/copyright ${moe_deb_dir}/changelog.Debian.gz
            DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${pkg} COMPONENT ${comp}
            EXCLUDE_FROM_ALL)
  endforeach()
endif()

set(CPACK_PACKAGE_NAME ${MOE_DEB_SOURCE})
set(CPACK_PACKAGE_VENDOR "moe-sidecar maintainers")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT ${MOE_DEB_MAINTAINER})
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_STRIP_FILES ON)
set(CPACK_GENERATOR DEB)
set(CPACK_COMPONENTS_ALL ${moe_deb_components})
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_PROJECT_CONFIG_FILE ${CMAKE_CURRENT_LIST_DIR}/debian/CPackProjectConfig.cmake)

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE ${MOE_DEB_RELEASE})
set(CPACK_DEBIAN_PACKAGE_MAINTAINER ${MOE_DEB_MAINTAINER})
set(CPACK_DEBIAN_PACKAGE_SOURCE ${MOE_DEB_SOURCE})
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")

set(CPACK_DEBIAN_DAEMON_PACKAGE_NAME moe-sidecar)
set(CPACK_DEBIAN_DAEMON_PACKAGE_SECTION misc)
set(CPACK_COMPONENT_DAEMON_DESCRIPTION
    "CPU expert-compute sidecar for GPU Mixture-of-Experts inference engines
moe-sidecar runs beside a GPU inference engine that serves a large
Mixture-of-Experts model and computes on the CPU the routed experts that are
not on the GPU. Engines talk to it through libmoe_client over a private
shared-memory channel; experts are read with io_uring and O_DIRECT within a
memory budget, and eBPF probes prove that they bypass the page cache.

This package holds the daemon and its commands (serve, stats, doctor, probe,
placement, inspect, simulate), the test-model generator moe-gen, the systemd
service and socket units, and the operations guide.")

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME libmoe-client1)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION libs)
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION
    "client library for the moe-sidecar expert-compute daemon
libmoe_client is the engine side of moe-sidecar's shared-memory channel: it
connects to a running sidecar, negotiates request slots and submits FORWARD,
PREFETCH and GPU-mask requests through lock-free rings. It starts no threads
and keeps no global state.

This package holds the shared library.")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libmoe-client-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libmoe-client1 (= ${MOE_DEB_VERSION})")
set(CPACK_COMPONENT_DEV_DESCRIPTION
    "client library for the moe-sidecar expert-compute daemon - development files
libmoe_client is the engine side of moe-sidecar's shared-memory channel: it
connects to a running sidecar, negotiates request slots and submits FORWARD,
PREFETCH and GPU-mask requests through lock-free rings.

This package holds the headers (moe_client.h, moe_abi.h), the static library,
the pkg-config file moe-client.pc and the CMake package MoeClient.")

# ldconfig runs from the trigger (lintian's lacks-ldconfig-trigger); CPack's own postinst and
# postrm still call it too (lintian warns: maintscript-calls-ldconfig).
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA ${CMAKE_CURRENT_LIST_DIR}/debian/triggers)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_STRICT_PERMISSION ON)

include(CPack)
