# cairn_library(<target> <component>): makes a Cairn library a good citizen.
#
#  - Cairn::<component> alias inside the build (for add_subdirectory and
#    FetchContent consumers) and EXPORT_NAME <component> for the installed
#    CairnConfig.cmake, so both spell it the same way;
#  - public headers from include/ (and the generated cairn/version.h) in the
#    build tree, from <prefix>/include once installed;
#  - C++20 required from consumers too (the headers use std::span etc.);
#  - shared builds: a versioned soname and only Cairn's own symbols exported
#    (cmake/cairn.map); fmt, spdlog, xxHash and the standard library's inline
#    code compiled into the library stay local, so they cannot clash with the
#    consumer's copies.
include_guard(GLOBAL)
include(GNUInstallDirs)

# Before 1.0 any minor release may change the ABI, so the soname carries
# major.minor (libcairn_core.so.0.1); from 1.0 on, the major alone.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(CAIRN_SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
else()
  set(CAIRN_SOVERSION ${PROJECT_VERSION_MAJOR})
endif()
set(CAIRN_VERSION_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/cairn.map)

# The version, for `cairn --version` and for consumers (#include <cairn/version.h>).
configure_file(${CMAKE_CURRENT_LIST_DIR}/version.h.in
               ${PROJECT_BINARY_DIR}/include/cairn/version.h @ONLY)

# Every Cairn library, in export order (CairnInstall installs them).
set_property(GLOBAL PROPERTY CAIRN_LIBRARIES "")

function(cairn_library target component)
  add_library(Cairn::${component} ALIAS ${target})
  set_property(GLOBAL APPEND PROPERTY CAIRN_LIBRARIES ${target})
  set_target_properties(${target} PROPERTIES
    EXPORT_NAME ${component}
    VERSION ${PROJECT_VERSION}
    SOVERSION ${CAIRN_SOVERSION}
    # No <target>_EXPORTS define (exports come from cmake/cairn.map), so a
    # shared build compiles exactly as a static PIC one and ccache shares them.
    DEFINE_SYMBOL "")
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_features(${target} PUBLIC cxx_std_20)
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "SHARED_LIBRARY")
    target_link_options(${target} PRIVATE
      -Wl,--version-script=${CAIRN_VERSION_SCRIPT}
      # Every library names the libraries it needs (no undefined symbols left
      # for the executable to provide).
      -Wl,--no-undefined)
    set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS ${CAIRN_VERSION_SCRIPT})
    # Installed next to each other: libcairn_format finds libcairn_core.
    set_property(TARGET ${target} PROPERTY INSTALL_RPATH "$ORIGIN")
  endif()
endfunction()
