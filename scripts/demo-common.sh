# Shared set-up of the demo scripts; sourced, not run. Sets `jobs` and
# `build`, installs the dependencies (once per demo.sh run: demo.sh exports
# CAIRN_DEPS_READY=1 for the scripts it calls), configures the build with
# scripts/test.sh's options so they share the build directory, and defines
#   demo_build TARGET...     build these targets
#   demo_storage NAME        set `storage` to $CAIRN_DEMO_STORAGE, or to a
#                            temporary directory removed at exit
jobs=${JOBS:-2}
build=${BUILD_DIR:-build}

if [ "${CAIRN_DEPS_READY:-}" != 1 ]; then
  bash scripts/install-deps.sh
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAIRN_WERROR=ON \
  -DCAIRN_TORCH=ON >/dev/null

demo_build() {
  echo "== build ($*)"
  ninja -C "$build" -j "$jobs" "$@"
}

demo_storage() {
  if [ -n "${CAIRN_DEMO_STORAGE:-}" ]; then
    storage=$CAIRN_DEMO_STORAGE
    mkdir -p "$storage"
  else
    storage=$(mktemp -d "${TMPDIR:-/tmp}/$1-XXXXXX")
    trap 'rm -rf "$storage"' EXIT
  fi
}
