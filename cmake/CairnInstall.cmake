# Install rules (CAIRN_INSTALL, ON for a top-level build): public headers,
# the libraries, the `cairn` command, CairnConfig.cmake for find_package,
# pkg-config files, and the CPack settings for `cpack -G DEB`. README, "Use
# Cairn in your project", shows how a consumer uses each.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(CAIRN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Cairn)
set(CAIRN_PKGCONFIG_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(BUILD_SHARED_LIBS)
  set(CAIRN_SHARED ON)
else()
  set(CAIRN_SHARED OFF)
endif()

# ---- headers: include/cairn/*.h and the generated cairn/version.h ---------
set(header_excludes)
if(NOT TARGET cairn_torch)
  # No adapter to link them with.
  list(APPEND header_excludes PATTERN torch.h EXCLUDE PATTERN torch_distributed.h EXCLUDE)
elseif(NOT CAIRN_TORCH_DISTRIBUTED)
  list(APPEND header_excludes PATTERN torch_distributed.h EXCLUDE)
endif()
if(NOT TARGET cairn_cuda)
  list(APPEND header_excludes PATTERN cuda.h EXCLUDE)
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/cairn ${PROJECT_BINARY_DIR}/include/cairn
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h" ${header_excludes})

# ---- libraries and the command ------------------------------------------
# Core, format, train and tune share one export set (CairnTargets.cmake); the
# LibTorch adapter has its own (CairnTorchTargets.cmake), loaded only when a
# consumer asks for the torch component, so no one else needs LibTorch.
get_property(cairn_libraries GLOBAL PROPERTY CAIRN_LIBRARIES)
set(cairn_components)
set(main_libraries)
foreach(lib IN LISTS cairn_libraries)
  get_target_property(component ${lib} EXPORT_NAME)
  list(APPEND cairn_components ${component})
  if(NOT lib STREQUAL "cairn_torch" AND NOT lib STREQUAL "cairn_cuda")
    list(APPEND main_libraries ${lib})
  endif()
endforeach()

install(TARGETS ${main_libraries} EXPORT CairnTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT CairnTargets NAMESPACE Cairn:: DESTINATION ${CAIRN_CMAKE_DIR})
if(TARGET cairn_torch)
  install(TARGETS cairn_torch EXPORT CairnTorchTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT CairnTorchTargets NAMESPACE Cairn:: DESTINATION ${CAIRN_CMAKE_DIR})
endif()
if(TARGET cairn_cuda)
  install(TARGETS cairn_cuda EXPORT CairnCudaTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT CairnCudaTargets NAMESPACE Cairn:: DESTINATION ${CAIRN_CMAKE_DIR})
endif()
if(TARGET cairn)
  install(TARGETS cairn RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

# ---- CairnConfig.cmake ----------------------------------------------------
# What the config needs to recreate the link interface: with static
# libraries, private dependencies (fmt, spdlog, xxHash, MPI) appear in it as
# $<LINK_ONLY:...>; with shared ones they do not.
set(CAIRN_TRAIN_MPI OFF)
if(TARGET cairn_train AND CAIRN_MPI)
  set(CAIRN_TRAIN_MPI ON)
endif()
set(CAIRN_MPI_C_LIBRARIES "${MPI_C_LIBRARIES}")
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/CairnConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/CairnConfig.cmake
  INSTALL_DESTINATION ${CAIRN_CMAKE_DIR})
# Until 1.0 a minor release may break the API; from 1.0, a major one.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(compatibility SameMinorVersion)
else()
  set(compatibility SameMajorVersion)
endif()
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/CairnConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY ${compatibility})
install(FILES ${PROJECT_BINARY_DIR}/cmake/CairnConfig.cmake
              ${PROJECT_BINARY_DIR}/cmake/CairnConfigVersion.cmake
              ${CMAKE_CURRENT_LIST_DIR}/Findxxhash.cmake
        DESTINATION ${CAIRN_CMAKE_DIR})

# ---- pkg-config -------------------------------------------------------------
# One file per component (cairn-core, cairn-format, cairn-train) and `cairn`,
# which requires all three. There is none for the torch adapter: LibTorch has
# no pkg-config file; use CMake for it. The prefix is written at install time,
# so `cmake --install --prefix` and CPack (which installs into /usr) get it
# right.
if(CAIRN_SHARED)
  set(CAIRN_PC_CORE_PRIVATE "")
  set(CAIRN_PC_FORMAT_PRIVATE "")
  set(CAIRN_PC_TRAIN_PRIVATE "")
  set(CAIRN_PC_TRAIN_LIBS_PRIVATE "")
  set(CAIRN_PC_TUNE_PRIVATE "")
else()
  # libcurl as -lcurl, not through libcurl.pc: `pkg-config --static` would
  # expand its Libs.private (ldap, ssh2, rtmp, ...), whose development links
  # are not installed; the shared libcurl brings those in itself.
  if(CAIRN_S3)
    set(CAIRN_PC_CORE_PRIVATE
        "Requires.private: fmt spdlog libxxhash libcrypto pugixml\nLibs.private: -lcurl")
  else()
    set(CAIRN_PC_CORE_PRIVATE "Requires.private: fmt spdlog libxxhash")
  endif()
  set(CAIRN_PC_FORMAT_PRIVATE "Requires.private: fmt libxxhash")
  set(CAIRN_PC_TRAIN_PRIVATE "Requires.private: fmt")
  set(CAIRN_PC_TRAIN_LIBS_PRIVATE "")
  set(CAIRN_PC_TUNE_PRIVATE "Requires.private: fmt")
  if(CAIRN_TRAIN_MPI)
    # The libraries FindMPI found; mpi-c.pc's own Libs.private would need
    # Open MPI's internal libraries' development links.
    list(JOIN MPI_C_LIBRARIES " " mpi_libs)
    set(CAIRN_PC_TRAIN_LIBS_PRIVATE "Libs.private: ${mpi_libs}")
  endif()
endif()
set(pc_files)
foreach(component core format train tune)
  if(component IN_LIST cairn_components)
    list(APPEND pc_files cairn-${component})
  endif()
endforeach()
string(REPLACE "cairn-" "" pc_umbrella_components "${pc_files}")
list(JOIN pc_umbrella_components ", " pc_umbrella_components)
list(JOIN pc_files " " CAIRN_PC_UMBRELLA_REQUIRES)
list(APPEND pc_files cairn)
foreach(pc IN LISTS pc_files)
  configure_file(${CMAKE_CURRENT_LIST_DIR}/pkgconfig/${pc}.pc.in
                 ${PROJECT_BINARY_DIR}/pkgconfig/${pc}.pc.in @ONLY)
endforeach()
install(CODE "
  foreach(pc ${pc_files})
    file(READ \"${PROJECT_BINARY_DIR}/pkgconfig/\${pc}.pc.in\" text)
    string(REPLACE \"%PREFIX%\" \"\${CMAKE_INSTALL_PREFIX}\" text \"\${text}\")
    file(WRITE \"${PROJECT_BINARY_DIR}/pkgconfig/\${pc}.pc\" \"\${text}\")
  endforeach()")
list(TRANSFORM pc_files REPLACE "(.+)" "${PROJECT_BINARY_DIR}/pkgconfig/\\1.pc")
install(FILES ${pc_files} DESTINATION ${CAIRN_PKGCONFIG_DIR})

# ---- cpack -G DEB -----------------------------------------------------------
# One package, `cairn`: the command, headers, libraries, CMake and pkg-config
# files, under /usr with the libraries in Debian's multiarch folder
# (lib/<triplet>, which GNUInstallDirs picks for the /usr prefix; the package
# must be made from a build configured with CMAKE_INSTALL_PREFIX=/usr, which
# cmake/CairnCPackChecks.cmake enforces). Its runtime dependencies come from
# dpkg-shlibdeps; the development packages its headers and link interface
# need are listed here: one for each find_dependency() of CairnConfig.cmake
# and each module of the .pc files' Requires(.private)/Libs.private that
# this build uses. tests/package/check_deb_depends.sh derives that list from
# the installed files and fails when a dependency has no package here.
set(CPACK_PACKAGE_NAME cairn)
set(CPACK_PACKAGE_VENDOR "Cairn")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "crash-safe checkpoints for distributed model training (C++ libraries and CLI)")
set(CPACK_PACKAGE_CONTACT "Cairn maintainers <cairn@localhost>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libdevel)
# The extended description; CPack puts the summary above it and indents it
# as deb-control(5) wants (lines starting with a space stay as they are).
set(deb_torch "")
if(TARGET cairn_torch)
  string(CONCAT deb_torch
    " - the LibTorch adapter (Cairn::torch): a module's weights, optimizer and\n"
    "   random generators as safetensors files that PyTorch and Hugging Face\n"
    "   load, and data-parallel training over Gloo;\n")
endif()
string(CONCAT CPACK_DEBIAN_PACKAGE_DESCRIPTION
  "Cairn saves model and training state as checkpoints that are whole or\n"
  "absent after any crash, on a local disk or S3, and keeps the best and the\n"
  "latest of them. This package holds:\n"
  " - the cairn command: ls, show, verify and gc of experiments and\n"
  "   checkpoints, and cp, which copies them between storages (local, s3://);\n"
  " - the libraries core, format, train and tune: storage and commit\n"
  "   protocol, CheckpointManager, the safetensors state engine, the Trainer\n"
  "   and the Tuner (hyperparameter search with ASHA, PBT and other\n"
  "   schedulers);\n"
  "${deb_torch}"
  " - their headers, CMake package (find_package(Cairn)) and pkg-config files.")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# CairnConfig.cmake: find_dependency(nlohmann_json) always; with static
# libraries fmt, spdlog, xxhash (Findxxhash.cmake), and with the S3 backend
# CURL, OpenSSL and pugixml; Cairn::train's MPI; Cairn::torch's Torch. The
# .pc files require the same (libcrypto from libssl-dev, -lcurl).
set(deb_depends "nlohmann-json3-dev (>= 3.11)")
if(NOT CAIRN_SHARED)
  string(APPEND deb_depends ", libfmt-dev, libspdlog-dev, libxxhash-dev")
  if(CAIRN_S3)
    string(APPEND deb_depends ", libcurl4-openssl-dev | libcurl-dev, libssl-dev, libpugixml-dev")
  endif()
  if(CAIRN_TRAIN_MPI)
    string(APPEND deb_depends ", libopenmpi-dev")
  endif()
endif()
# Cairn::torch's LibTorch is a torch wheel's (torch.utils.cmake_prefix_path),
# which no Debian package provides: a consumer of the adapter puts that
# wheel's CMake folder on CMAKE_PREFIX_PATH, as Cairn's own build does.
if(TARGET cairn_cuda)
  string(APPEND deb_depends ", nvidia-cuda-toolkit")
endif()
set(CPACK_DEBIAN_PACKAGE_DEPENDS "${deb_depends}")
if(CAIRN_SHARED)
  # The package's own libraries satisfy each other's NEEDED entries.
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CMAKE_INSTALL_LIBDIR})
endif()
# Checked when cpack runs: a .deb for /usr from a build whose library folder
# is not Debian's multiarch one would put the libraries in /usr/lib.
set(CPACK_CAIRN_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
set(CPACK_CAIRN_MULTIARCH "")
if(CMAKE_LIBRARY_ARCHITECTURE AND EXISTS /etc/debian_version)
  set(CPACK_CAIRN_MULTIARCH "${CMAKE_LIBRARY_ARCHITECTURE}")
endif()
set(CPACK_PROJECT_CONFIG_FILE ${CMAKE_CURRENT_LIST_DIR}/CairnCPackChecks.cmake)
set(CPACK_GENERATOR DEB)
set(CPACK_SOURCE_GENERATOR TGZ)
set(CPACK_SOURCE_IGNORE_FILES "/build[^/]*/" "/\\\\.git/" "/\\\\.cache/")
include(CPack)
