import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, it } from 'node:test';

const require = createRequire(import.meta.url);
const root = new URL('../..', import.meta.url).pathname;
const project = new URL('../types/tsconfig.json', import.meta.url).pathname;

// sample.ts is the CommonJS view (require conditions, .d.ts), esm.mts the ESM view (.d.mts).
for (const pkg of ['typescript-5.2', 'typescript']) {
  const { version } = require(`${pkg}/package.json`);
  it(`the declarations compile with TypeScript ${version}, from CommonJS and from ESM`, () => {
    const tsc = require.resolve(`${pkg}/bin/tsc`);
    const r = spawnSync(process.execPath, [tsc, '-p', project], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stdout + r.stderr);
  });
}

const packDir = mkdtempSync(join(tmpdir(), 'locco-attw-'));
after(() => rmSync(packDir, { recursive: true, force: true }));

it('arethetypeswrong finds no problem in the packed tarball', () => {
  const pack = spawnSync('npm', ['pack', '--json', '--pack-destination', packDir], { cwd: root, encoding: 'utf8' });
  assert.equal(pack.status, 0, pack.stderr);
  const [{ filename }] = JSON.parse(pack.stdout);
  const attw = require.resolve('@arethetypeswrong/cli/package.json').replace(/package\.json$/, 'dist/index.js');
  const r = spawnSync(process.execPath, [attw, join(packDir, filename), '--format', 'json'], {
    encoding: 'utf8',
    maxBuffer: 64 * 1024 * 1024,
  });
  const report = JSON.parse(r.stdout);
  const entrypoints = Object.keys(report.analysis.entrypoints).sort();
  assert.deepEqual(entrypoints, ['.', './etcd', './memory', './mongo', './mutex', './otel', './package.json', './postgres', './redis', './testing']);
  const problems = Object.values(report.problems ?? {}).flat();
  assert.deepEqual(
    problems.map((p) => `${p.kind} ${p.entrypoint ?? ''} ${p.resolutionKind ?? ''}`),
    [],
    'attw problems',
  );
  assert.equal(r.status, 0, r.stderr);
  // ESM consumers get the .d.mts types, CommonJS consumers the .d.ts ones.
  const res = report.analysis.entrypoints['.'].resolutions;
  assert.match(res['node16-esm'].resolution.fileName, /index\.d\.mts$/);
  assert.match(res['node16-cjs'].resolution.fileName, /index\.d\.ts$/);
});

it('the main declarations carry a JSDoc @example', async () => {
  const { readFile } = await import('node:fs/promises');
  const wanted = {
    'index.d.ts': ['export declare class Locker', 'acquire(key', 'tryAcquire(key', 'withLock<T>(key', 'export interface LockAdapter'],
    'entry/memory.d.ts': ['export declare class InMemoryAdapter'],
    'entry/redis.d.ts': ['export declare class RedisAdapter'],
    'entry/postgres.d.ts': ['export declare class PostgresAdapter'],
    'entry/mongo.d.ts': ['export declare class MongoAdapter'],
    'entry/etcd.d.ts': ['export declare class EtcdAdapter'],
    'entry/mutex.d.ts': ['export declare class MutexManager', 'runOperation<T>('],
    'entry/testing.d.ts': ['export declare function runLockAdapterContract'],
    'entry/otel.d.ts': ['export declare function lockMetrics'],
  };
  for (const [file, declarations] of Object.entries(wanted)) {
    const text = await readFile(join(root, file), 'utf8');
    for (const d of declarations) {
      const at = text.indexOf(d);
      assert.ok(at > 0, `${file}: ${d} not found`);
      // The doc comment right before the declaration.
      const before = text.slice(0, at);
      const comment = before.slice(before.lastIndexOf('/**'));
      assert.ok(comment.trimEnd().endsWith('*/') && /@example/.test(comment), `${file}: ${d} has no @example`);
    }
  }
});
