#!/usr/bin/env node
// Runs a command (the napi build) with a protoc for the etcd client, whose build script compiles
// .proto files. PROTOC or a protoc on PATH wins; else PROTOC points at the binary of the
// protoc-bin-vendored crate (a build-dependency, so cargo has fetched it), found through
// `cargo metadata`. So a fresh checkout builds without installing protobuf-compiler.
import { execFileSync, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';

const [command, ...args] = process.argv.slice(2);
if (!command) {
  console.error('usage: node scripts/with-protoc.mjs <command> [args…]');
  process.exit(2);
}

function onPath(cmd) {
  try {
    execFileSync(process.platform === 'win32' ? 'where' : 'sh', process.platform === 'win32' ? [cmd] : ['-c', `command -v ${cmd}`], {
      stdio: 'ignore',
    });
    return true;
  } catch {
    return false;
  }
}

// The crate names of protoc-bin-vendored's binaries, by the host this runs on.
const HOSTS = {
  'linux-x64': 'linux-x86_64',
  'linux-arm64': 'linux-aarch_64',
  'linux-ia32': 'linux-x86_32',
  'linux-ppc64': 'linux-ppcle_64',
  'linux-s390x': 'linux-s390_64',
  'darwin-x64': 'macos-x86_64',
  'darwin-arm64': 'macos-aarch_64',
  'win32-x64': 'win32',
  'win32-ia32': 'win32',
  'win32-arm64': 'win32',
};

function vendoredProtoc() {
  const host = HOSTS[`${process.platform}-${process.arch}`];
  if (!host) throw new Error(`no vendored protoc for ${process.platform}-${process.arch}: install protoc, or set PROTOC`);
  const metadata = JSON.parse(
    execFileSync('cargo', ['metadata', '--format-version', '1', '--locked'], { encoding: 'utf8', maxBuffer: 256 << 20, stdio: ['ignore', 'pipe', 'inherit'] }),
  );
  const pkg = metadata.packages.find((p) => p.name === `protoc-bin-vendored-${host}`);
  if (!pkg) throw new Error(`cargo metadata lists no protoc-bin-vendored-${host}: install protoc, or set PROTOC`);
  const bin = join(dirname(pkg.manifest_path), 'bin', process.platform === 'win32' ? 'protoc.exe' : 'protoc');
  if (!existsSync(bin)) throw new Error(`${bin} is missing: install protoc, or set PROTOC`);
  return bin;
}

const env = { ...process.env };
if (!env.PROTOC && !onPath('protoc')) {
  try {
    env.PROTOC = vendoredProtoc();
  } catch (err) {
    console.error(`scripts/with-protoc.mjs: ${err.message}`);
    process.exit(1);
  }
}
const child = spawn(command, args, { stdio: 'inherit', env, shell: process.platform === 'win32' });
child.on('exit', (code, signal) => process.exit(code ?? (signal ? 1 : 0)));
