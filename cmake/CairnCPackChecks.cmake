# Run by cpack for each generator (CPACK_PROJECT_CONFIG_FILE): a Debian
# package installs under /usr, where Debian keeps libraries in the multiarch
# folder (/usr/lib/<triplet>). GNUInstallDirs picks that folder only when the
# build is configured with CMAKE_INSTALL_PREFIX=/usr; refuse to make a .deb
# from any other build rather than ship libraries in /usr/lib.
if(CPACK_GENERATOR STREQUAL "DEB" AND CPACK_CAIRN_MULTIARCH AND
   NOT CPACK_CAIRN_LIBDIR STREQUAL "lib/${CPACK_CAIRN_MULTIARCH}")
  message(FATAL_ERROR
    "cairn .deb: the libraries would go to /usr/${CPACK_CAIRN_LIBDIR}, not Debian's multiarch "
    "/usr/lib/${CPACK_CAIRN_MULTIARCH}; configure the build with -DCMAKE_INSTALL_PREFIX=/usr "
    "(or -DCMAKE_INSTALL_LIBDIR=lib/${CPACK_CAIRN_MULTIARCH}) before running cpack -G DEB")
endif()
