#!/usr/bin/env bash
# Cairn as a dependency, checked end to end from outside the source tree:
#
#   1. static (PIC) build, installed into a temporary prefix: the files, the
#      `cairn` command, a shared object made from the static archives,
#      tests/package/consumer built with find_package(Cairn) and with
#      `pkg-config --static`, and run; what README and docs/ tell a consumer
#      (its first pkg-config line, its component table: check_readme.sh);
#   2. BUILD_SHARED_LIBS=ON, installed likewise: soname links, only cairn::
#      symbols exported, the consumer built both ways and run;
#   3. the consumer through add_subdirectory(<checkout>) with GoogleTest,
#      LibTorch, MPI and CLI11 made unfindable: nothing but the libraries is
#      configured;
#   4. `cpack -G DEB` from the static build configured for /usr: the
#      package's fields (a real maintainer and description), its Depends
#      against what the installed CairnConfig.cmake and .pc files need
#      (check_deb_depends.sh), its files in Debian's multiarch library
#      folder; a build for another prefix is refused; as root it is installed
#      with dpkg -i, `cairn --version` and a pkg-config build run from it, and
#      it is removed again (otherwise it is only extracted);
#   5. `pip install .` of the Python package into a fresh venv, offline, and
#      the package used from outside the checkout (pip.sh);
#   6. the release wheel (scripts/build-wheel.sh): repaired by auditwheel to
#      a manylinux tag, installed into a fresh venv, loading no library from
#      outside the wheel but glibc's and the C++ runtime (wheel.sh).
#
# One line per check ("package: ok|FAIL <check>", with its seconds), then a
# total; exit 1 if any check failed. Everything happens in a temporary
# directory removed at the exit, except Cairn's own build folders (below),
# removed likewise; the .deb is removed from the system even on failure.
# LibTorch is left out to keep it fast.
#
# Uses ccache when it is installed. Cairn's own builds (static, shared, pip,
# the consumer's add_subdirectory) are folders directly in the checkout,
# build-package-*.XXXXXX, and compile with the test command's normal-build
# flags (RelWithDebInfo with -g1, -Werror): with CCACHE_BASEDIR at the
# checkout and the build folder left out of the hash (CCACHE_NOHASHDIR),
# their compile lines are those of build/, so that after scripts/test.sh's
# normal build ccache serves the library instead of compiling it again (on
# an empty cache it compiled the library twice, 4.6 and 3.3 of this test's 9
# minutes).
# Usage: tests/package/run.sh       Environment: JOBS (default 2), KEEP=1
# keeps the temporary directory for inspection (Cairn's build folders in the
# checkout are removed all the same).
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
jobs=${JOBS:-2}
work=$(mktemp -d "${TMPDIR:-/tmp}/cairn-package.XXXXXX")
mkdir -p "$work/logs"
deb_installed=0
static_build=""
shared_build=""
subdir_build=""
cleanup() {
  for d in "$static_build" "$shared_build" "$subdir_build"; do [ -z "$d" ] || rm -rf "$d"; done
  if [ "$deb_installed" -eq 1 ]; then
    dpkg -r cairn >/dev/null 2>&1 || echo "package: could not remove the cairn package (dpkg -r cairn)"
  fi
  if [ "${KEEP:-0}" = 1 ]; then echo "package: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

passed=0
failed=0
# check NAME COMMAND...: runs COMMAND with its output in a log; prints one line.
check() {
  local name=$1
  shift
  local log
  log="$work/logs/$(printf '%s' "$name" | tr -c 'A-Za-z0-9' '_').log"
  local start=$SECONDS
  if "$@" >"$log" 2>&1; then
    echo "package: ok   $name ($((SECONDS - start)) s)"
    passed=$((passed + 1))
  else
    echo "package: FAIL $name after $((SECONDS - start)) s (last lines of $log:)"
    tail -n 25 "$log" | sed 's/^/    /'
    failed=$((failed + 1))
  fi
}

version=$(sed -nE 's/^project\(cairn VERSION ([0-9.]+).*/\1/p' "$src/CMakeLists.txt")
cmake_common=(-G Ninja -DCMAKE_BUILD_TYPE=Release)
if command -v ccache >/dev/null; then
  # Static and shared builds compile identically (PIC, no export define), and
  # as scripts/test.sh's normal build does (see above).
  export CCACHE_BASEDIR=$src CCACHE_NOHASHDIR=1
  cmake_common+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
static_build=$(mktemp -d "$src/build-package-static.XXXXXX")
shared_build=$(mktemp -d "$src/build-package-shared.XXXXXX")
subdir_build=$(mktemp -d "$src/build-package-subdir.XXXXXX")
# shellcheck source=scripts/build-flags.sh
source "$src/scripts/build-flags.sh"  # normal_build_flags: scripts/test.sh's build/
cairn_options=("${normal_build_flags[@]}" -DCAIRN_TORCH=OFF -DCAIRN_PYTHON=OFF
               -DCAIRN_BUILD_TESTS=OFF -DCAIRN_BUILD_EXAMPLES=OFF
               -DCAIRN_BUILD_BENCH=OFF)

# build_and_install KIND PREFIX [cmake args]: Cairn itself.
build_and_install() {
  local kind=$1 prefix=$2
  shift 2
  local dir=$static_build
  [ "$kind" = static ] || dir=$shared_build
  cmake -S "$src" -B "$dir" "${cmake_common[@]}" "${cairn_options[@]}" \
    -DCMAKE_INSTALL_PREFIX="$prefix" "$@" &&
    ninja -C "$dir" -j "$jobs" &&
    cmake --install "$dir"
}

# consumer_cmake NAME PREFIX [cmake args]: tests/package/consumer with
# find_package(Cairn) from PREFIX, both programs built and run.
consumer_cmake() {
  local name=$1 prefix=$2
  shift 2
  cmake -S "$src/tests/package/consumer" -B "$work/consumer-$name" "${cmake_common[@]}" \
    -DCMAKE_PREFIX_PATH="$prefix" "$@" &&
    ninja -C "$work/consumer-$name" -j "$jobs" &&
    "$work/consumer-$name/consumer" &&
    "$work/consumer-$name/consumer_train"
}

# consumer_pkgconfig NAME PKG_CONFIG_PATH LD_LIBRARY_PATH [pkg-config flags]: the
# consumer (with the training runtime) built by a plain g++ line, and run.
consumer_pkgconfig() {
  local name=$1 pc_path=$2 lib_path=$3
  shift 3
  local flags
  flags=$(PKG_CONFIG_PATH=$pc_path pkg-config --cflags --libs "$@" cairn) || return 1
  echo "g++ -std=c++20 -DCONSUMER_WITH_TRAIN main.cc $flags"
  # shellcheck disable=SC2086  # pkg-config's output is a word list
  g++ -std=c++20 -O1 -DCONSUMER_WITH_TRAIN "$src/tests/package/consumer/main.cc" \
    -o "$work/pkgconfig-$name" $flags &&
    LD_LIBRARY_PATH=$lib_path "$work/pkgconfig-$name"
}

installed_files() {  # installed_files PREFIX FILE...
  local prefix=$1 f
  shift
  for f in "$@"; do
    [ -e "$prefix/$f" ] || { echo "missing $prefix/$f"; return 1; }
  done
}

version_is() {  # version_is CAIRN_BINARY
  local out
  out=$("$1" --version)
  echo "$out"
  [ "$out" = "cairn $version" ]
}

# ---- 1. static, position-independent ---------------------------------------
static=$work/prefix-static
echo "package: building Cairn $version (static, PIC) and installing into a temporary prefix"
check "static: configure, build, install" build_and_install static "$static"
check "static: headers, archives, CairnConfig, pkg-config files, cairn installed" \
  installed_files "$static" include/cairn/manager.h include/cairn/version.h \
  lib/libcairn_core.a lib/libcairn_format.a lib/libcairn_train.a lib/libcairn_tune.a \
  lib/cmake/Cairn/CairnConfig.cmake lib/cmake/Cairn/CairnConfigVersion.cmake \
  lib/cmake/Cairn/CairnTargets.cmake lib/cmake/Cairn/Findxxhash.cmake \
  lib/pkgconfig/cairn.pc lib/pkgconfig/cairn-core.pc lib/pkgconfig/cairn-format.pc \
  lib/pkgconfig/cairn-train.pc lib/pkgconfig/cairn-tune.pc include/cairn/tune.h include/cairn/tuner.h bin/cairn
check "static: torch.h and torch_distributed.h not installed without the adapter" \
  test ! -e "$static/include/cairn/torch.h" -a ! -e "$static/include/cairn/torch_distributed.h"
check "static: cuda.h not installed without CAIRN_CUDA; device.h (core) installed" \
  test ! -e "$static/include/cairn/cuda.h" -a -e "$static/include/cairn/device.h"
check "static: cairn --version prints 'cairn $version'" version_is "$static/bin/cairn"
link_into_shared_object() {
  # shellcheck disable=SC2046  # pkg-config's output is a word list
  # Fails with "recompile with -fPIC" if any object is not position-independent.
  g++ -shared -o "$work/pic-check.so" -Wl,--whole-archive "$static/lib/libcairn_train.a" \
    "$static/lib/libcairn_format.a" "$static/lib/libcairn_core.a" -Wl,--no-whole-archive \
    $(PKG_CONFIG_PATH=$static/lib/pkgconfig pkg-config --libs --static cairn)
}
check "static: the archives link into a shared object (PIC)" link_into_shared_object
check "static: find_package(Cairn) consumer builds and runs" consumer_cmake static "$static"
check "static: pkg-config --static consumer builds and runs" \
  consumer_pkgconfig static "$static/lib/pkgconfig" "" --static
check "static: README's first pkg-config line works; its table and docs' targets are Cairn's" \
  "$src/tests/package/check_readme.sh" "$src" "$static"
refuses_version() {  # refuses_version VERSION: find_package(Cairn VERSION) must fail
  local out
  if out=$(cmake -S "$src/tests/package/consumer" -B "$work/consumer-version-$1" -G Ninja \
    -DCMAKE_PREFIX_PATH="$static" -DCAIRN_CONSUMER_VERSION="$1" 2>&1); then
    echo "$out"
    echo "find_package(Cairn $1) accepted Cairn $version"
    return 1
  fi
  echo "$out"
  grep -q "requested version \"$1\"" <<<"$out"
}
check "static: find_package(Cairn 9.0) is refused (CairnConfigVersion.cmake)" refuses_version 9.0

# ---- 2. shared ----------------------------------------------------------------
shared=$work/prefix-shared
soversion=$(echo "$version" | awk -F. '$1 == 0 { print $1 "." $2; next } { print $1 }')
echo "package: building Cairn $version (BUILD_SHARED_LIBS=ON)"
check "shared: configure, build, install" build_and_install shared "$shared" -DBUILD_SHARED_LIBS=ON
soname_links() {
  local lib
  for lib in core format train tune; do
    local so=$shared/lib/libcairn_$lib.so
    [ "$(readlink "$so")" = "libcairn_$lib.so.$soversion" ] || { echo "bad $so link"; return 1; }
    [ "$(readlink "$so.$soversion")" = "libcairn_$lib.so.$version" ] || { echo "bad soname link"; return 1; }
    readelf -d "$so.$version" | grep -F "SONAME" | grep -F "[libcairn_$lib.so.$soversion]" || return 1
  done
}
check "shared: libcairn_*.so -> .so.$soversion -> .so.$version, SONAME libcairn_*.so.$soversion" soname_links
exports_only_cairn() {
  local lib syms foreign
  for lib in core format train tune; do
    syms=$(nm -D --defined-only -C "$shared/lib/libcairn_$lib.so")
    foreign=$(echo "$syms" | awk '{ $1 = ""; $2 = ""; sub(/^ +/, ""); print }' |
      grep -vE '^((typeinfo|typeinfo name|vtable|VTT|guard variable|non-virtual thunk|virtual thunk) (for|to) )?cairn::' || true)
    if [ -n "$foreign" ]; then
      echo "libcairn_$lib.so exports symbols outside namespace cairn:"
      echo "$foreign" | head -20
      return 1
    fi
    echo "libcairn_$lib.so: $(echo "$syms" | wc -l) symbols, all cairn::"
  done
  nm -D --defined-only -C "$shared/lib/libcairn_core.so" | grep -F "typeinfo for cairn::Error" &&
    ! nm -D --defined-only -C "$shared/lib/libcairn_core.so" | grep -E 'fmt::|spdlog::|XXH'
}
check "shared: only cairn:: symbols exported (typeinfo for cairn::Error yes; fmt, spdlog, XXH no)" \
  exports_only_cairn
check "shared: installed cairn runs through its RUNPATH" version_is "$shared/bin/cairn"
check "shared: find_package(Cairn) consumer builds and runs" consumer_cmake shared "$shared"
check "shared: pkg-config consumer builds and runs (LD_LIBRARY_PATH)" \
  consumer_pkgconfig shared "$shared/lib/pkgconfig" "$shared/lib"

# ---- 3. add_subdirectory -------------------------------------------------------
subdir_consumer() {
  # Cairn's objects compile as in the other builds (see the top), served by
  # ccache (version.h, in the binary folder's include/, differs in its path).
  local b=$subdir_build
  cmake -S "$src/tests/package/consumer" -B "$b" "${cmake_common[@]}" \
    "${normal_build_flags[@]}" -DCAIRN_SOURCE_DIR="$src" \
    -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON \
    -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON || return 1
  local opt
  for opt in CAIRN_BUILD_TESTS CAIRN_BUILD_EXAMPLES CAIRN_BUILD_BENCH CAIRN_BUILD_CLI \
    CAIRN_TORCH CAIRN_MPI CAIRN_INSTALL; do
    grep -q "^$opt:BOOL=OFF" "$b/CMakeCache.txt" || { echo "$opt is not OFF"; return 1; }
  done
  local extra
  extra=$(ninja -C "$b" -t targets all | grep -oE '^[^:]+' |
    grep -E '(_test|test_|demo|bench|fuzz|crash_worker|cairn_testing)' || true)
  [ -z "$extra" ] || { echo "targets that should not exist: $extra"; return 1; }
  ! ctest --test-dir "$b" -N | grep -E 'Test +#' || return 1
  ninja -C "$b" -j "$jobs" consumer consumer_train && "$b/consumer" && "$b/consumer_train"
}
echo "package: building the consumer with add_subdirectory(<checkout>)"
check "add_subdirectory: no tests/examples/bench/CLI, GTest/Torch/MPI/CLI11 not needed; consumer runs" \
  subdir_consumer

# ---- 4. Debian package -------------------------------------------------------
# The static build again, configured for /usr (compile flags unchanged, so
# nothing is rebuilt): GNUInstallDirs then picks Debian's multiarch library
# folder, which the package must use.
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
deb_build() {
  cmake -S "$src" -B "$static_build" -DCMAKE_INSTALL_PREFIX=/usr || return 1
  (cd "$static_build" && cpack -G DEB) || return 1
  deb=$(ls "$static_build"/cairn_*.deb) && echo "$deb"
}
echo "package: cpack -G DEB"
deb=""
check "deb: cpack -G DEB makes a package (build configured for /usr)" deb_build
deb=$(ls "$static_build"/cairn_*.deb 2>/dev/null || true)
deb_refuses_plain_lib() {
  # A build configured for another prefix would put the libraries in
  # /usr/lib: cpack refuses it, naming the fix.
  local b=$work/build-static-lib out
  cmake -S "$src" -B "$b" "${cmake_common[@]}" "${cairn_options[@]}" -DCAIRN_BUILD_CLI=OFF \
    -DCMAKE_INSTALL_PREFIX="$work/elsewhere" >/dev/null || return 1
  if out=$(cd "$b" && cpack -G DEB 2>&1); then
    echo "$out"
    echo "cpack made a .deb with the libraries in /usr/lib"
    return 1
  fi
  echo "$out"
  grep -q "CMAKE_INSTALL_PREFIX=/usr" <<<"$out"
}
deb_fields() {
  dpkg-deb -I "$deb" &&
    [ "$(dpkg-deb -f "$deb" Package)" = cairn ] &&
    [ "$(dpkg-deb -f "$deb" Version)" = "$version" ] &&
    dpkg-deb -f "$deb" Depends | grep -q 'libfmt' &&
    dpkg-deb -f "$deb" Depends | grep -q 'libc6' || return 1
  # A maintainer with a name and an address, not a placeholder.
  local maintainer description
  maintainer=$(dpkg-deb -f "$deb" Maintainer)
  grep -qE '^[^<]+ <[^@ ]+@[^> ]+>$' <<<"$maintainer" || { echo "Maintainer: $maintainer"; return 1; }
  if grep -qiE 'example\.(org|com|net)|changeme|todo' <<<"$maintainer"; then
    echo "placeholder Maintainer: $maintainer"
    return 1
  fi
  # A description that says what is in the package.
  description=$(dpkg-deb -f "$deb" Description)
  local word
  for word in "cairn command" " cp" "tune" "find_package(Cairn)" "pkg-config"; do
    grep -qF "$word" <<<"$description" || { echo "Description lacks \"$word\""; return 1; }
  done
}
check "deb: Package, Version, Maintainer (not a placeholder), Description, Depends" deb_fields
check "deb: Depends declares what CairnConfig.cmake and the .pc files need" \
  "$src/tests/package/check_deb_depends.sh" "$deb"
deb_contents() {
  dpkg-deb -c "$deb" | awk '{ print $NF }' | sed 's|^\./|/|' >"$work/deb-files" &&
    for f in /usr/bin/cairn /usr/include/cairn/manager.h /usr/include/cairn/version.h \
      "/usr/lib/$multiarch/libcairn_core.a" "/usr/lib/$multiarch/cmake/Cairn/CairnConfig.cmake" \
      "/usr/lib/$multiarch/pkgconfig/cairn.pc"; do
      grep -qxF "$f" "$work/deb-files" || { echo "missing $f"; return 1; }
    done &&
    ! grep -E '^/usr/lib/[^/]+\.(a|so)' "$work/deb-files" &&
    dpkg-deb -x "$deb" "$work/deb-root" &&
    grep -q '^prefix=/usr$' "$work/deb-root/usr/lib/$multiarch/pkgconfig/cairn-core.pc" &&
    grep -q "^libdir=\${prefix}/lib/$multiarch\$" "$work/deb-root/usr/lib/$multiarch/pkgconfig/cairn-core.pc"
}
check "deb: cairn, headers, libraries, CMake and pkg-config files in /usr/lib/$multiarch" deb_contents
check "deb: cpack refuses a build whose libraries would go to /usr/lib" deb_refuses_plain_lib
if [ "$(id -u)" -eq 0 ] && [ -n "$deb" ]; then
  if dpkg-query -W -f='${Status}' cairn 2>/dev/null | grep -q installed || [ -e /usr/bin/cairn ]; then
    echo "package: skip installing the .deb: a cairn package or /usr/bin/cairn is already present"
  else
    deb_install() {
      deb_installed=1
      dpkg -i "$deb"
    }
    check "deb: dpkg -i installs it" deb_install
    check "deb: /usr/bin/cairn --version" version_is /usr/bin/cairn
    check "deb: pkg-config consumer builds against /usr and runs" \
      consumer_pkgconfig deb "" "" --static
    deb_remove() {
      dpkg -r cairn && deb_installed=0 && [ ! -e /usr/bin/cairn ] && [ ! -e /usr/include/cairn ] &&
        [ ! -e "/usr/lib/$multiarch/cmake/Cairn" ]
    }
    check "deb: dpkg -r removes it, leaving nothing behind" deb_remove
  fi
else
  check "deb: extracted cairn --version (not root: not installed)" \
    version_is "$work/deb-root/usr/bin/cairn"
fi

# ---- 5. pip install . ---------------------------------------------------------
echo "package: pip install . (the Python package, offline, into a fresh venv)"
check "pip: offline pip install . into a venv; cairn imported from outside the checkout, save/load, CheckpointManager" \
  env TMPDIR="$work" JOBS="$jobs" bash "$src/tests/package/pip.sh"

# ---- 6. the release wheel ------------------------------------------------------
echo "package: the release wheel (scripts/build-wheel.sh), installed into a fresh venv"
check "wheel: auditwheel-repaired manylinux wheel; only vendored libraries; smoke test outside the checkout" \
  env TMPDIR="$work" JOBS="$jobs" bash "$src/tests/package/wheel.sh"

echo "package: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
