# shellcheck shell=bash
# The normal build's CMake flags, sourced by scripts/test.sh (build/) and by
# the package test (tests/package/run.sh, pip.sh): its builds must compile
# exactly as build/ does for ccache to serve them build/'s objects.
# Debug information as line tables only (-g1): a backtrace keeps its files
# and lines, and a library file compiles in about 0.7 of the time -g takes
# (measured on two).
normal_build_flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"
                    -DCAIRN_WERROR=ON)
