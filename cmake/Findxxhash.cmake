# Findxxhash: the xxHash library (Debian's libxxhash-dev ships headers, a
# library and a pkg-config file, but no CMake package).
#
# Defines the imported target xxhash::xxhash and xxhash_FOUND. Used by Cairn's
# own build and, installed next to CairnConfig.cmake, by consumers of a static
# Cairn, whose link interface names xxhash::xxhash.
find_path(XXHASH_INCLUDE_DIR xxhash.h)
find_library(XXHASH_LIBRARY NAMES xxhash)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(xxhash REQUIRED_VARS XXHASH_LIBRARY XXHASH_INCLUDE_DIR)
mark_as_advanced(XXHASH_INCLUDE_DIR XXHASH_LIBRARY)
if(xxhash_FOUND AND NOT TARGET xxhash::xxhash)
  add_library(xxhash::xxhash UNKNOWN IMPORTED)
  set_target_properties(xxhash::xxhash PROPERTIES
    IMPORTED_LOCATION "${XXHASH_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${XXHASH_INCLUDE_DIR}")
endif()
