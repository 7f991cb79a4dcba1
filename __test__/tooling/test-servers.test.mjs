// The test servers' helpers: a server that cannot start says why, at once.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { readFileSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { it } from 'node:test';
import { hasCommand, secantusBinary, startEtcd, startMongo, startRedis } from '../support/servers.mjs';

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

it('a test process that dies of an uncaught error takes its servers with it', async () => {
  // A test file whose set-up throws after it started a server (a second server missing, say)
  // never reaches its dispose: the server must not outlive the process as an orphan.
  const script = `
    import { startRedis } from ${JSON.stringify(new URL('../support/servers.mjs', import.meta.url).href)};
    const server = await startRedis();
    console.log(server.pid);
    throw new Error('set-up failed after the server started');
  `;
  const child = spawn(process.execPath, ['--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'ignore'] });
  let out = '';
  child.stdout.setEncoding('utf8').on('data', (d) => (out += d));
  const code = await new Promise((r) => child.once('exit', r));
  assert.notEqual(code, 0, 'the script failed as it should');
  const pid = Number(out.trim());
  assert.ok(pid > 0, `the script printed the server's pid: ${JSON.stringify(out)}`);
  // Gone, or a zombie that nobody reaped yet (state Z): either way no longer running.
  const alive = () => {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
    } catch {
      return false;
    }
  };
  const until = Date.now() + 5000;
  while (alive() && Date.now() < until) await new Promise((r) => setTimeout(r, 50));
  const survived = alive();
  if (survived) process.kill(pid, 'SIGKILL');
  assert.equal(survived, false, `redis-server ${pid} outlived the process that started it`);
});
