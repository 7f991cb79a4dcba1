// The test servers' helpers: a server that cannot start says why, at once.
import assert from 'node:assert/strict';
import { createServer } from 'node:net';
import { readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { it } from 'node:test';
import { hasCommand, secantusBinary, startEtcd, startMongo, startRedis } from './support/servers.mjs';

const tempDirs = (prefix) => readdirSync(tmpdir()).filter((d) => d.startsWith(prefix)).sort();
const redisDirs = () => tempDirs('locco-redis-');

it('a redis-server that cannot bind its port fails with its own words, not a later timeout', async () => {
  const squatter = createServer();
  await new Promise((r) => squatter.listen(0, '127.0.0.1', r));
  const { port } = squatter.address();
  const before = redisDirs();
  const started = Date.now();
  try {
    const err = await startRedis({ port }).then(
      async (server) => {
        await server.dispose();
        return null;
      },
      (e) => e,
    );
    assert.ok(err, 'startRedis answered a server on a port another process holds');
    assert.match(err.message, /Address already in use/);
    assert.ok(Date.now() - started < 5000, `took ${Date.now() - started} ms`);
    assert.deepEqual(redisDirs(), before, 'the failed start left its temp dir behind');
  } finally {
    squatter.close();
  }
});

/** A plain TCP server on a free loopback port, standing in for another process that took it. */
async function squat() {
  const squatter = createServer();
  await new Promise((r) => squatter.listen(0, '127.0.0.1', r));
  return squatter;
}

/** What `start(port)` answers on a port another process holds: the error, or null for a server. */
async function startOnTakenPort(start, dirPrefix) {
  const squatter = await squat();
  const before = tempDirs(dirPrefix);
  try {
    const err = await start(squatter.address().port).then(
      async (server) => {
        await server.dispose();
        return null;
      },
      (e) => e,
    );
    assert.deepEqual(tempDirs(dirPrefix), before, 'the failed start left its temp dir behind');
    return err;
  } finally {
    squatter.close();
  }
}

const secantus = (() => {
  try {
    return secantusBinary();
  } catch {
    return undefined;
  }
})();

it('a MongoDB server (secantusd-rs) on a taken port fails with its own words', { skip: secantus === undefined && 'secantusd-rs is not built (scripts/test-all.sh builds it)' }, async () => {
  const err = await startOnTakenPort((port) => startMongo({ port }), 'locco-mongo-');
  assert.ok(err, 'startMongo answered a server on a port another process holds');
  assert.match(err.message, /exited .* before it listened on port/);
});

it('an etcd member on a taken port fails with its own words', { skip: !hasCommand('etcd') && 'etcd is not installed' }, async () => {
  const err = await startOnTakenPort((port) => startEtcd({ port }), 'locco-etcd-');
  assert.ok(err, 'startEtcd answered a member on a port another process holds');
  assert.match(err.message, /exited .* before it listened on port[\s\S]*address already in use/);
});
