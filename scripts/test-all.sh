#!/usr/bin/env bash
# Installs what is missing, builds once (debug), and runs every test: the Rust workspace,
# then the JavaScript suites on Node 24 (node:test and vitest). The README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."

need() { command -v "$1" >/dev/null 2>&1; }

# System packages the test servers need come from Debian (none yet: the in-memory backend
# needs no server; the Redis, PostgreSQL and MongoDB suites add theirs here).
if ! need cargo; then
  echo "cargo is missing: install the Rust toolchain (rustup) first" >&2
  exit 1
fi
if ! need npm; then
  echo "npm is missing: install Node.js (any version; Node 24 comes from npm) first" >&2
  exit 1
fi

# npm's cache lives outside the repository (~/.npm), so a fresh clone installs from it.
if [ ! -x node_modules/.bin/node ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund
fi

npm run build
cargo test --workspace
npm test
