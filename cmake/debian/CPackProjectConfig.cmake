# Read by cpack for each generator (CPACK_PROJECT_CONFIG_FILE): Debian packages install under
# /usr (policy; lintian's dir-in-usr-local), and the units name the daemon by the configured
# prefix, so a build configured for another prefix cannot make them.
if(CPACK_GENERATOR STREQUAL "DEB" AND NOT CPACK_PACKAGING_INSTALL_PREFIX STREQUAL "/usr")
  message(FATAL_ERROR "Debian packages install under /usr, this build under "
                      "${CPACK_PACKAGING_INSTALL_PREFIX}: configure a build with "
                      "-DCMAKE_INSTALL_PREFIX=/usr for them (docs/operations.md, Install)")
endif()
