// The test servers' helpers: a server that cannot start says why, at once.
import assert from 'node:assert/strict';
import { createServer } from 'node:net';
import { it } from 'node:test';
import { startRedis } from './support/servers.mjs';

it('a redis-server that cannot bind its port fails with its own words, not a later timeout', async () => {
  const squatter = createServer();
  await new Promise((r) => squatter.listen(0, '127.0.0.1', r));
  const { port } = squatter.address();
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
  } finally {
    squatter.close();
  }
});
