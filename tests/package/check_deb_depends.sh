#!/usr/bin/env bash
# Checks that a cairn .deb declares every development package that its
# installed CairnConfig.cmake and pkg-config files need, derived from those
# files rather than from a list kept by hand:
#
#   1. CMake: a project finds Cairn in the extracted package, asking for
#      every component it was built with, under `cmake --trace`; every
#      find_dependency()/find_package() that CairnConfig.cmake runs is
#      traced back to a file (the <Pkg>_DIR's config file, or the library or
#      header a find module chose, from the CMake cache), and `dpkg -S`
#      names the package that owns it;
#   2. pkg-config: every module the cairn-*.pc files require (Requires and
#      Requires.private) is traced to its .pc file, every -lNAME and library
#      path of Libs.private to the library the linker finds, and the owner of
#      each is looked up the same way.
#
# Each owner must appear in the package's Depends (any alternative of a
# `a | b` group counts). So a new find_dependency() or Requires.private
# without a package dependency fails here. Threads is the C library's and is
# not traced. Needs dpkg, cmake, pkg-config and g++, with the build's
# dependencies installed (their owners are looked up on this system).
#
# Usage: check_deb_depends.sh CAIRN_DEB      One line per dependency, then
# "deb depends: ok" (exit 0) or a list of what is missing (exit 1).
set -euo pipefail
deb=$1
work=$(mktemp -d "${TMPDIR:-/tmp}/cairn-deb-depends.XXXXXX")
trap 'rm -rf "$work"' EXIT

dpkg-deb -x "$deb" "$work/root"
root=$work/root

# Depends: every package name of every alternative, one per line.
dpkg-deb -f "$deb" Depends | tr ',|' '\n\n' | sed -E 's/\(.*\)//; s/:[a-z0-9]+$//; s/^ +//; s/ +$//' |
  grep -v '^$' | sort -u >"$work/depends"

config=$(find "$root" -name CairnConfig.cmake | head -n 1)
[ -n "$config" ] || { echo "deb depends: no CairnConfig.cmake in $deb"; exit 1; }
components=$(sed -nE 's/^set\(_cairn_available (.*)\)$/\1/p' "$config" | tr ';' ' ')
[ -n "$components" ] || { echo "deb depends: $config lists no components"; exit 1; }

missing=0
checked=0
# owner_of FILE: the packages owning FILE (or, failing that, what it links
# to), comma-separated names without architecture.
owner_of() {
  local f out
  f=$(realpath -s "$1")  # ../ removed, links kept: dpkg knows the link's own path
  out=$(dpkg -S "$f" 2>/dev/null || dpkg -S "$(readlink -f "$f")" 2>/dev/null || true)
  out=$(printf '%s\n' "$out" | grep -v '^diversion' | head -n 1)
  [ -n "$out" ] || return 1
  printf '%s\n' "${out%%: /*}" | tr ',' '\n' | sed -E 's/^ +//; s/:[a-z0-9]+$//' | paste -sd,
}
# need WHAT FILE: the owner of FILE must be a dependency of the package.
need() {
  local what=$1 file=$2 owners ok=0 p
  checked=$((checked + 1))
  if ! owners=$(owner_of "$file"); then
    echo "MISSING $what: no package owns $file"
    missing=$((missing + 1))
    return
  fi
  for p in ${owners//,/ }; do
    grep -qxF "$p" "$work/depends" && ok=1
  done
  if [ "$ok" -eq 1 ]; then
    echo "ok      $what: $file ($owners) is a dependency"
  else
    echo "MISSING $what: $file belongs to $owners, which the package does not depend on"
    missing=$((missing + 1))
  fi
}

# ---- 1. CMake --------------------------------------------------------------------
mkdir -p "$work/project"
cat >"$work/project/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.21)
project(cairn_deb_depends LANGUAGES CXX)
find_package(Cairn REQUIRED COMPONENTS $components)
EOF
if ! cmake -S "$work/project" -B "$work/project/build" -DCMAKE_PREFIX_PATH="$root/usr" \
  --trace-expand --trace-format=json-v1 --trace-redirect="$work/trace.json" \
  >"$work/configure.log" 2>&1; then
  tail -n 30 "$work/configure.log"
  echo "deb depends: find_package(Cairn COMPONENTS $components) from the package failed"
  exit 1
fi
# The packages CairnConfig.cmake looked for (find_dependency is a macro
# around find_package; both are traced at the line of CairnConfig.cmake).
python3 - "$work/trace.json" >"$work/cmake-packages" <<'EOF'
import json, sys
seen = []
for line in open(sys.argv[1]):
    try:
        e = json.loads(line)
    except ValueError:
        continue
    if e.get("file", "").endswith("/CairnConfig.cmake") and \
            e.get("cmd", "").lower() in ("find_dependency", "find_package") and e.get("args"):
        name = e["args"][0]
        if name not in seen:
            seen.append(name)
print("\n".join(seen))
EOF
cache=$work/project/build/CMakeCache.txt
while read -r name; do
  [ -n "$name" ] || continue
  [ "$name" = Threads ] && continue  # the C library's
  file=""
  # A config package: the <Name>Config.cmake in <Name>_DIR.
  dir=$(sed -nE "s|^${name}_DIR:PATH=(.*)$|\\1|p" "$cache")
  if [ -n "$dir" ] && [ -d "$dir" ]; then
    file=$(find "$dir" -maxdepth 1 \( -iname "${name}Config.cmake" -o -iname "${name}-config.cmake" \) | head -n 1)
  fi
  # A find module: the first library (else header folder file) it chose,
  # from the cache entries named after the package.
  if [ -z "$file" ]; then
    upper=$(printf '%s' "$name" | tr '[:lower:]' '[:upper:]')
    file=$(grep -E "^(${name}|${upper})_[A-Z_]*LIBRAR[A-Z_]*:FILEPATH=/" "$cache" | head -n 1 | cut -d= -f2- || true)
  fi
  if [ -z "$file" ] || [ ! -e "$file" ]; then
    echo "MISSING cmake $name: CairnConfig.cmake finds it, but no file of it shows in the CMake cache"
    missing=$((missing + 1))
    checked=$((checked + 1))
    continue
  fi
  need "cmake find_dependency($name)" "$file"
done <"$work/cmake-packages"
# Libraries CairnConfig.cmake names by path (MPI's, for a static
# Cairn::train when the consumer does not enable C).
for f in $(grep -oE '"/[^"]+"' "$config" | tr -d '"' | tr ';' '\n'); do
  [ -f "$f" ] && need "CairnConfig.cmake names $f" "$f"
done

# ---- 2. pkg-config ----------------------------------------------------------------
pcdir=$(dirname "$(find "$root" -name cairn-core.pc | head -n 1)")
for pc in "$pcdir"/cairn*.pc; do
  modules=$(sed -nE 's/^Requires(\.private)?: *(.*)$/\2/p' "$pc" | tr ',' '\n' |
    sed -E 's/[<>=!].*$//; s/^ +//; s/ +$//' | grep -v '^$' | grep -v '^cairn' || true)
  for m in $modules; do
    dir=$(pkg-config --variable=pcfiledir "$m" 2>/dev/null || true)
    if [ -z "$dir" ] || [ ! -e "$dir/$m.pc" ]; then
      echo "MISSING pkg-config $(basename "$pc"): requires $m, which pkg-config cannot find"
      missing=$((missing + 1))
      continue
    fi
    need "pkg-config $(basename "$pc") requires $m" "$dir/$m.pc"
  done
  libs=$(sed -nE 's/^Libs\.private: *(.*)$/\1/p' "$pc")
  for token in $libs; do
    case $token in
      -l*)
        lib=$(g++ -print-file-name="lib${token#-l}.so")
        if [ "$lib" = "lib${token#-l}.so" ]; then
          lib=$(g++ -print-file-name="lib${token#-l}.a")
        fi
        need "pkg-config $(basename "$pc") links $token" "$lib"
        ;;
      /*) need "pkg-config $(basename "$pc") links $token" "$token" ;;
    esac
  done
done

if [ "$missing" -ne 0 ]; then
  echo "deb depends: $missing of $checked dependencies of the installed CMake and pkg-config files are not declared in Depends ($(paste -sd' ' "$work/depends"))"
  exit 1
fi
echo "deb depends: ok ($checked dependencies, all declared)"
