// scripts/test-all.sh on a machine that has nothing yet: it must get past the empty cache, and
// every failure must say which line and command failed. The tools it would call are stubs on a
// PATH of their own, so nothing is installed, built or run for real. And the build's protoc
// comes from cargo when the machine has none.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, it } from 'node:test';

const script = new URL('../../scripts/test-all.sh', import.meta.url).pathname;
const work = mkdtempSync(join(tmpdir(), 'locco-test-all-'));
after(() => rmSync(work, { recursive: true, force: true }));

const bash = ['/usr/bin/bash', '/bin/bash'].find((p) => existsSync(p));

/** A PATH holding the few real tools the script uses and a stub for each of `stubs`. */
function fakeMachine(name, stubs) {
  const bin = join(work, name, 'bin');
  mkdirSync(bin, { recursive: true });
  for (const tool of ['dirname', 'mkdir', 'id', 'ls', 'find', 'head', 'touch']) {
    const real = [`/usr/bin/${tool}`, `/bin/${tool}`].find((p) => existsSync(p));
    symlinkSync(real, join(bin, tool));
  }
  for (const [tool, body] of Object.entries(stubs)) {
    writeFileSync(join(bin, tool), `#!/bin/sh\n${body}\n`);
    chmodSync(join(bin, tool), 0o755);
  }
  const cache = join(work, name, 'cache'); // empty: a new machine
  mkdirSync(cache);
  return { PATH: bin, HOME: join(work, name), XDG_CACHE_HOME: cache, LOCCO_TEST_MONGO_URL: 'mongodb://stub' };
}

const servers = {
  'redis-server': 'exit 0',
  'redis-cli': 'exit 0',
  openssl: 'exit 0',
  psql: 'exit 0',
  'apt-get': 'exit 0',
};

it('with an empty cache, test-all.sh goes on to install Valkey, and a failure there names its line and command', () => {
  const env = fakeMachine('fresh', { ...servers, python3: 'echo "python3 stub: no venv here" >&2; exit 7' });
  const r = spawnSync(bash, [script], { env, encoding: 'utf8' });
  assert.equal(r.status, 7, r.stderr);
  assert.match(r.stderr, /python3 stub: no venv here/);
  assert.match(r.stderr, /scripts\/test-all\.sh: line \d+: `python3 -m venv "\$CACHE\/valkey"` failed \(exit 7\)/);
});

it('a failing build stops test-all.sh with the command that failed', () => {
  const env = fakeMachine('build', {
    ...servers,
    'valkey-server': 'exit 0',
    cargo: 'exit 0',
    npm: 'if [ "$1" = run ]; then echo "npm stub: build broke" >&2; exit 5; fi; exit 0',
  });
  const r = spawnSync(bash, [script], { env, encoding: 'utf8' });
  assert.equal(r.status, 5, r.stderr);
  assert.match(r.stderr, /scripts\/test-all\.sh: line \d+: `npm run build` failed \(exit 5\)/);
});

it('a missing tool is named, not a silent exit', () => {
  const env = fakeMachine('nocargo', { ...servers, 'valkey-server': 'exit 0' });
  const r = spawnSync(bash, [script], { env, encoding: 'utf8' });
  assert.equal(r.status, 1);
  assert.match(r.stderr, /cargo is missing/);
});

it('with no protoc on the machine, the build is given the vendored one', () => {
  const bin = join(work, 'noprotoc', 'bin');
  mkdirSync(bin, { recursive: true });
  const cargo = spawnSync('sh', ['-c', 'command -v cargo'], { encoding: 'utf8' }).stdout.trim();
  for (const [tool, real] of [['node', process.execPath], ['cargo', cargo], ['sh', ['/usr/bin/sh', '/bin/sh'].find((p) => existsSync(p))]]) {
    symlinkSync(real, join(bin, tool));
  }
  const env = { PATH: bin, HOME: process.env.HOME };
  const withProtoc = new URL('../../scripts/with-protoc.mjs', import.meta.url).pathname;
  const r = spawnSync(process.execPath, [withProtoc, 'node', '-e', 'process.stdout.write(process.env.PROTOC ?? "")'], { env, encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /protoc-bin-vendored-[^/]+\/bin\/protoc$/);
  const version = spawnSync(r.stdout, ['--version'], { encoding: 'utf8' });
  assert.match(version.stdout, /libprotoc/);
});
