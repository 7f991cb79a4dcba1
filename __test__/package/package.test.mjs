// The package as a user gets it: `npm pack` the main package and this machine's platform
// package, install both tarballs into an empty project whose PATH holds only the Node binary's
// folder (no compiler, no cargo, no node-gyp), and use every entry point from CommonJS and ESM.
// Also: the loader's error when no binary fits names the platform and the package to install.
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, realpathSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, before, describe, it } from 'node:test';

const root = new URL('../..', import.meta.url).pathname;
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
const nodeDir = dirname(realpathSync(process.execPath));

/** This machine's platform as the npm/ folders name it. */
function hostPlatform() {
  const { platform, arch } = process;
  if (platform === 'linux') {
    const glibc = process.report.getReport().header.glibcVersionRuntime;
    return `linux-${arch}-${glibc ? 'gnu' : 'musl'}`;
  }
  if (platform === 'win32') return `win32-${arch}-msvc`;
  return `${platform}-${arch}`;
}

const platform = hostPlatform();
const binary = `locco-rs.${platform}.node`;
const platformDir = join(root, 'npm', platform);
const missing = !existsSync(join(platformDir, 'package.json'))
  ? `no npm/${platform} package for this machine`
  : !existsSync(join(root, binary))
    ? `${binary} is not built (run npm run build)`
    : !existsSync(join(root, 'binding.js'))
      ? 'binding.js is not built (run npm run build)'
      : false;

const npmCli = (() => {
  const found = spawnSync('sh', ['-c', 'command -v npm'], { encoding: 'utf8' }).stdout.trim();
  return found ? realpathSync(found) : undefined;
})();

const work = mkdtempSync(join(tmpdir(), 'locco-package-'));
after(() => rmSync(work, { recursive: true, force: true }));

/** Runs npm with the Node binary under test and PATH limited to its folder. */
function npm(args, cwd) {
  return execFileSync(process.execPath, [npmCli, ...args], {
    cwd,
    encoding: 'utf8',
    env: { PATH: nodeDir, HOME: process.env.HOME, npm_config_update_notifier: 'false', npm_config_fund: 'false' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
}

function pack(dir) {
  const [{ filename, files }] = JSON.parse(npm(['pack', '--json', '--pack-destination', work], dir));
  return { tarball: join(work, filename), files: files.map((f) => f.path) };
}

/** Runs a script file in `cwd` with PATH limited to the Node binary's folder. */
function run(cwd, file, source) {
  writeFileSync(join(cwd, file), source);
  const r = spawnSync(process.execPath, [file], { cwd, encoding: 'utf8', env: { PATH: nodeDir } });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

it('package.json lists every npm/<platform> package as an optional dependency at its own version', () => {
  const expected = {};
  for (const dir of readdirSync(join(root, 'npm')).sort()) {
    const sub = JSON.parse(readFileSync(join(root, 'npm', dir, 'package.json'), 'utf8'));
    assert.equal(sub.version, pkg.version, `npm/${dir} is at ${sub.version}, the main package at ${pkg.version}`);
    assert.equal(sub.name, `${pkg.name}-${dir}`);
    expected[sub.name] = pkg.version;
  }
  assert.ok(Object.keys(expected).length >= 6);
  assert.deepEqual(pkg.optionalDependencies, expected);
});

it('package-lock.json carries the platform packages as optional entries, so npm ci accepts it', () => {
  // Without these entries `npm ci` refuses the lock ("Missing: locco-rs-<platform> from lock
  // file"), since npm install records nothing for a package it cannot fetch (unpublished).
  const lock = JSON.parse(readFileSync(join(root, 'package-lock.json'), 'utf8'));
  assert.deepEqual(lock.packages[''].optionalDependencies, pkg.optionalDependencies);
  for (const dir of readdirSync(join(root, 'npm'))) {
    const sub = JSON.parse(readFileSync(join(root, 'npm', dir, 'package.json'), 'utf8'));
    const entry = lock.packages[`node_modules/${sub.name}`];
    assert.ok(entry, `${sub.name} is missing from package-lock.json`);
    assert.equal(entry.optional, true);
    assert.equal(entry.version, sub.version);
    assert.deepEqual([entry.os, entry.cpu, entry.libc], [sub.os, sub.cpu, sub.libc], sub.name);
  }
});

describe('installed from packed tarballs, without build tools', { skip: missing || (!npmCli && 'npm not found') }, () => {
  const app = join(work, 'app');
  let main;

  before(() => {
    main = pack(root);
    // The platform package as the release flow makes it: its package.json plus the binary.
    const staged = join(work, `platform-${platform}`);
    cpSync(platformDir, staged, { recursive: true });
    cpSync(join(root, binary), join(staged, binary));
    const plat = pack(staged);
    for (const f of [binary, 'package.json']) assert.ok(plat.files.includes(f), `${f} is missing from the platform tarball`);
    mkdirSync(app);
    writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'app', version: '1.0.0', private: true }));
    // --offline: the test needs no registry. The other platforms' packages are optional
    // dependencies that npm cannot fetch here, so it skips them, as it does for a wrong os/cpu.
    npm(['install', '--offline', '--no-audit', '--no-fund', '--loglevel=error', main.tarball, plat.tarball], app);
  });

  it('the main tarball carries the JavaScript and types but no native binary', () => {
    assert.equal(main.files.filter((f) => f.endsWith('.node')).length, 0, main.files.join(' '));
    for (const f of ['index.js', 'index.mjs', 'index.d.ts', 'index.d.mts', 'binding.js', 'lib/load.js', 'bin/locco-rs.js', 'LICENSE', 'README.md']) {
      assert.ok(main.files.includes(f), `${f} is missing from the tarball`);
    }
    assert.ok(existsSync(join(app, 'node_modules', `${pkg.name}-${platform}`, binary)));
    assert.equal(readdirSync(join(app, 'node_modules', pkg.name)).filter((f) => f.endsWith('.node')).length, 0);
  });

  it('the locco-rs command is installed in node_modules/.bin and runs', () => {
    // Through its #!/usr/bin/env node line, with PATH holding only the Node binary's folder.
    const r = spawnSync(join(app, 'node_modules', '.bin', 'locco-rs'), ['--version'], { cwd: app, encoding: 'utf8', env: { PATH: nodeDir } });
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.stdout.trim(), pkg.version);
    assert.deepEqual(pkg.bin, { 'locco-rs': 'bin/locco-rs.js' });
  });

  it("require('locco-rs') and every subpath work from CommonJS; an in-memory lock", () => {
    const r = run(
      app,
      'check.cjs',
      `const { Locker, LockHeldError } = require('locco-rs');
const { InMemoryAdapter } = require('locco-rs/memory');
const binary = require.resolve('${pkg.name}-${platform}');
(async () => {
  const locker = new Locker({ adapter: new InMemoryAdapter() });
  const lock = await locker.acquire('cjs', { ttl: 5000 });
  const second = await locker.tryAcquire('cjs', { ttl: 5000 });
  const state = lock.state;
  const released = await lock.release();
  const subpaths = {
    redis: typeof require('locco-rs/redis').RedisAdapter,
    postgres: typeof require('locco-rs/postgres').PostgresAdapter,
    mongo: typeof require('locco-rs/mongo').MongoAdapter,
    mutex: typeof require('locco-rs/mutex').MutexManager,
    testing: typeof require('locco-rs/testing').runLockAdapterContract,
    otel: typeof require('locco-rs/otel').lockMetrics,
  };
  // @opentelemetry/api is an optional peer, not installed here: the error names it.
  let otelMissing = 'no error';
  try {
    require('locco-rs/otel').lockMetrics();
  } catch (e) {
    otelMissing = e.field + ': ' + e.message;
  }
  console.log(JSON.stringify({ state, second, released, held: typeof LockHeldError, subpaths, binary, otelMissing }));
})().catch((e) => { console.error(e); process.exit(1); });
`,
    );
    assert.equal(r.status, 0, r.stderr);
    const out = JSON.parse(r.stdout);
    const fn = 'function';
    assert.deepEqual(
      { ...out, binary: undefined, otelMissing: undefined },
      {
        state: 'held',
        second: null,
        released: true,
        held: fn,
        subpaths: { redis: fn, postgres: fn, mongo: fn, mutex: fn, testing: fn, otel: fn },
        binary: undefined,
        otelMissing: undefined,
      },
    );
    assert.match(out.otelMissing, /^meter: .*npm install @opentelemetry\/api/);
    assert.ok(out.binary.startsWith(join(realpathSync(app), 'node_modules')), out.binary);
  });

  it("import 'locco-rs' and every subpath export work; memory and mutex take a lock", () => {
    const r = run(
      app,
      'check.mjs',
      `import { Locker, ValidationError } from 'locco-rs';
import { InMemoryAdapter } from 'locco-rs/memory';
import { RedisAdapter } from 'locco-rs/redis';
import { PostgresAdapter, postgresLocksDdl } from 'locco-rs/postgres';
import { MongoAdapter, mongoLocksIndexes } from 'locco-rs/mongo';
import { MutexManager } from 'locco-rs/mutex';
import * as testing from 'locco-rs/testing';
import { lockMetrics } from 'locco-rs/otel';

const locker = new Locker({ adapter: new InMemoryAdapter(), fencing: true });
const lock = await locker.acquire('esm', { ttl: 5000 });
const fence = lock.fence;
await lock.release();
const mutex = new MutexManager();
const inMutex = await mutex.runOperation('esm', ({ heldMutexIds }) => [...heldMutexIds]);
console.log(JSON.stringify({
  fence,
  inMutex,
  types: [RedisAdapter, PostgresAdapter, MongoAdapter, ValidationError].map((c) => typeof c),
  ddl: postgresLocksDdl().includes('CREATE TABLE'),
  indexes: mongoLocksIndexes().length,
  testing: typeof testing.runLockAdapterContract,
  otel: typeof lockMetrics,
}));
`,
    );
    assert.equal(r.status, 0, r.stderr);
    assert.deepEqual(JSON.parse(r.stdout), {
      fence: 1,
      inMutex: ['esm'],
      types: ['function', 'function', 'function', 'function'],
      ddl: true,
      indexes: 2,
      testing: 'function',
      otel: 'function',
    });
  });
});

describe('the loader without a binary for this platform', { skip: !existsSync(join(root, 'binding.js')) && 'binding.js is not built' }, () => {
  // A copy of the package's JavaScript with no .node file anywhere it could be found.
  const copy = join(work, 'no-binary', 'locco-rs');
  before(() => {
    mkdirSync(copy, { recursive: true });
    for (const f of ['package.json', 'binding.js', 'index.js', 'entry', 'lib']) cpSync(join(root, f), join(copy, f), { recursive: true });
  });

  const expectedPackage = `${pkg.name}-${platform}`;
  const triple =
    process.platform === 'linux'
      ? `${process.platform}-${process.arch} (${platform.endsWith('musl') ? 'musl' : 'glibc'})`
      : `${process.platform}-${process.arch}`;

  function loadFails(entry) {
    const r = run(
      copy,
      'probe.cjs',
      `try { require(${JSON.stringify(entry)}); console.log('loaded'); } catch (e) {
  console.log(JSON.stringify({ message: e.message, code: e.code, packageName: e.packageName, cause: e.cause && e.cause.message }));
}`,
    );
    assert.equal(r.status, 0, r.stderr);
    assert.notEqual(r.stdout.trim(), 'loaded', 'the copy without a binary loaded one');
    return JSON.parse(r.stdout);
  }

  it('lib/load.js names the platform it looked for, the package to install, and keeps the cause', () => {
    const e = loadFails('./lib/load.js');
    assert.equal(e.code, 'LOCCO_NATIVE_LOAD');
    assert.equal(e.packageName, expectedPackage);
    assert.ok(e.message.includes(triple), e.message);
    assert.ok(e.message.includes(`npm install ${expectedPackage}@${pkg.version}`), e.message);
    assert.doesNotMatch(e.message, /npm has a bug/);
    assert.match(e.cause, /native binding/i);
  });

  it('lib/load.js says to build when binding.js itself is missing', () => {
    rmSync(join(copy, 'binding.js'));
    try {
      const e = loadFails('./lib/load.js');
      assert.equal(e.code, 'LOCCO_NATIVE_LOAD');
      assert.match(e.message, /binding\.js is missing: .*npm run build/);
      assert.match(e.cause, /Cannot find module '\.\.\/binding\.js'/);
    } finally {
      cpSync(join(root, 'binding.js'), join(copy, 'binding.js'));
    }
  });

  it("require('locco-rs') fails with the loader's message", () => {
    const e = loadFails('./index.js');
    assert.equal(e.packageName, expectedPackage);
    assert.ok(e.message.includes(triple), e.message);
  });

  it('in the repository, lib/load.js answers the binding itself', () => {
    const r = spawnSync(process.execPath, ['-e', "const b = require('./lib/load.js'); console.log(typeof b.init, b === require('./binding.js'))"], {
      cwd: root,
      encoding: 'utf8',
    });
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.stdout.trim(), 'function true');
  });
});
