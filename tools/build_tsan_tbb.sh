#!/usr/bin/env bash
# Builds oneTBB with ThreadSanitizer into the cache, for tools/test.sh --sanitize thread.
#
# Why: the engine is a oneTBB flow graph. Debian's libtbb is not instrumented, so TSan cannot see
# the synchronisation inside its scheduler and allocator (a task spawned on one thread and run
# on another), and reports hundreds of false races on every message the graph passes. oneTBB's
# own CI tests with an instrumented TBB for the same reason. We build the very source of the
# installed libtbb-dev (Debian's source package, same version as the headers we compile against)
# with TBB_SANITIZE=thread, once per machine, into $PIPELINE_CACHE/onetbb-<version>-tsan.
#
#   tools/build_tsan_tbb.sh PREFIX     (prints nothing on success when PREFIX is already built)
set -euo pipefail
PREFIX=$1
[[ -f $PREFIX/lib/cmake/TBB/TBBConfig.cmake ]] && exit 0
VERSION=$(dpkg-query -W -f='${Version}' libtbb-dev)
say() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }
say "building oneTBB $VERSION with ThreadSanitizer into $PREFIX (once; a few minutes)"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# apt-get source needs deb-src entries: derive them from this machine's own deb entries, in a
# private apt state directory (the system's apt configuration is not touched).
mkdir -p "$WORK/parts" "$WORK/lists/partial" "$WORK/src"
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
  [[ -f $f ]] && sed -n 's/^deb /deb-src /p' "$f" >> "$WORK/parts/derived.list"
done
for f in /etc/apt/sources.list.d/*.sources; do
  [[ -f $f ]] && sed 's/^Types:.*/Types: deb-src/' "$f" > "$WORK/parts/$(basename "$f")"
done
APT=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$WORK/parts" -o Dir::State::Lists="$WORK/lists"
     -o APT::Sandbox::User=root)
apt-get "${APT[@]}" update -qq >&2
(cd "$WORK/src" && apt-get "${APT[@]}" source --download-only -qq "onetbb=$VERSION" >&2 && tar xf onetbb_*.orig.tar.*)
SRC=$(find "$WORK/src" -maxdepth 1 -type d -name 'oneTBB-*' | head -1)
cmake -S "$SRC" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTBB_SANITIZE=thread -DTBB_TEST=OFF \
      -DTBB_EXAMPLES=OFF -DTBBMALLOC_BUILD=OFF -DTBB_STRICT=OFF -DCMAKE_INSTALL_PREFIX="$PREFIX.partial" >/dev/null
cmake --build "$WORK/build" -j"$(nproc)" >/dev/null
cmake --install "$WORK/build" >/dev/null
rm -rf "$PREFIX"
mv "$PREFIX.partial" "$PREFIX"
