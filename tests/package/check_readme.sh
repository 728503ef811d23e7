#!/usr/bin/env bash
# Checks what README.md and docs/ tell a consumer against an installed
# Cairn (run by tests/package/run.sh on the default, static, install):
#
#   1. the first pkg-config command of README's "pkg-config" section,
#      run as written against PREFIX, builds tests/package/consumer/main.cc
#      and the program runs;
#   2. README's component table has a row for every component the sources
#      define (cairn_library(<target> <component>), optional ones included),
#      as `Cairn::<component>`, and names every installed cairn-<c>.pc;
#   3. no target_link_libraries() in README.md or docs/ names a target that
#      Cairn does not install (`Cairn::<component>` of step 2) or a
#      build-tree name (`cairn_torch`).
#
# Usage: check_readme.sh SOURCE_DIR PREFIX     One line per finding; exit 1
# if any check fails.
set -euo pipefail
src=$1
prefix=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/cairn-readme.XXXXXX")
trap 'rm -rf "$work"' EXIT
failed=0
fail() {
  echo "FAIL $*"
  failed=1
}

libdir=$(dirname "$(find "$prefix" -name cairn-core.pc | head -n 1)")
libdir=$(dirname "$libdir")
config=$(find "$prefix" -name CairnConfig.cmake | head -n 1)
[ -n "$config" ] || { echo "FAIL no CairnConfig.cmake under $prefix"; exit 1; }

# ---- 1. the first pkg-config line ------------------------------------------------
line=$(awk '/^### pkg-config/ { in_section = 1; next } /^### / { in_section = 0 }
            in_section && /\$\(pkg-config / { print; exit }' "$src/README.md")
if [ -z "$line" ]; then
  fail "README.md: no pkg-config command under \"### pkg-config\""
else
  args=$(sed -E 's/.*\$\(pkg-config ([^)]*)\).*/\1/' <<<"$line")
  echo "README's first pkg-config line: $line"
  # shellcheck disable=SC2086  # pkg-config's arguments and output are word lists
  if flags=$(PKG_CONFIG_PATH=$libdir/pkgconfig pkg-config $args) &&
    g++ -std=c++20 -O1 "$src/tests/package/consumer/main.cc" -o "$work/readme-consumer" $flags \
      >"$work/link.log" 2>&1 &&
    "$work/readme-consumer" >/dev/null; then
    echo "ok   it builds and runs against the default (static) install"
  else
    tail -n 5 "$work/link.log" 2>/dev/null || true
    fail "README.md's first pkg-config line ($args) does not build against the default (static) install"
  fi
fi

# ---- 2. the component table ----------------------------------------------------------
components=$(grep -rhoE 'cairn_library\([a-z_]+ +[a-z]+\)' "$src/src" |
  sed -E 's/.* +([a-z]+)\)$/\1/' | sort -u | tr '\n' ' ')
for c in $components; do
  if grep -qE "^\| *$c *\| *\`Cairn::$c\`" "$src/README.md"; then
    echo "ok   README's table has $c (Cairn::$c)"
  else
    fail "README.md's component table has no row for $c (\`Cairn::$c\`)"
  fi
done
for pc in "$libdir"/pkgconfig/cairn-*.pc; do
  m=$(basename "$pc" .pc)
  grep -qF "\`$m\`" "$src/README.md" || fail "README.md does not name the pkg-config module $m"
done

# ---- 3. targets in examples -------------------------------------------------------------
while IFS= read -r hit; do
  for target in $(grep -oE '(Cairn::[a-z_]+|cairn_[a-z_]+)' <<<"${hit#*:*:}"); do
    case $target in
      Cairn::*)
        grep -qw "${target#Cairn::}" <<<"$components" || fail "$hit: $target is not an installed target"
        ;;
      *) fail "$hit: $target is a build-tree name; consumers link Cairn::${target#cairn_}" ;;
    esac
  done
done < <(grep -nE 'target_link_libraries\(' "$src/README.md" "$src"/docs/*.md || true)

[ "$failed" -eq 0 ] && echo "readme: ok"
exit "$failed"
