// The test servers' helpers: a server that cannot start says why, at once.
import assert from 'node:assert/strict';
import { createServer } from 'node:net';
import { readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { it } from 'node:test';
import { startRedis } from './support/servers.mjs';

const redisDirs = () => readdirSync(tmpdir()).filter((d) => d.startsWith('locco-redis-')).sort();

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
