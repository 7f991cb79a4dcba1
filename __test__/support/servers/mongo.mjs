// MongoDB test servers: secantusd-rs, or a mongod of yours through LOCCO_TEST_MONGO_URL.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { homedir, tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort, hasCommand, listening, spawnLogged, withRetries } from './common.mjs';

/** The MongoDB-wire-compatible server the tests start (secantusd-rs, cached by the test script). */
export function secantusBinary() {
  if (process.env.LOCCO_SECANTUS) return process.env.LOCCO_SECANTUS;
  if (hasCommand('secantusd-rs')) return 'secantusd-rs';
  const bin = join(process.env.XDG_CACHE_HOME ?? join(homedir(), '.cache'), 'locco-rs', 'secantus', 'bin', 'secantusd-rs');
  try {
    execFileSync(bin, ['--version'], { stdio: 'ignore' });
    return bin;
  } catch {
    throw new Error('secantusd-rs not found: run scripts/test-all.sh, which builds and caches it');
  }
}

/**
 * A MongoDB for the tests: LOCCO_TEST_MONGO_URL when set (a real mongod of yours), else
 * secantusd-rs on a free port (or `port`) with a temp storage path. Answers { url, name, dispose }.
 */
export async function startMongo({ port: askedPort } = {}) {
  if (process.env.LOCCO_TEST_MONGO_URL) {
    return { url: process.env.LOCCO_TEST_MONGO_URL, name: 'LOCCO_TEST_MONGO_URL', async dispose() {} };
  }
  const binary = secantusBinary();
  const start = async () => {
    const port = askedPort ?? (await freePort());
    const dir = mkdtempSync(join(tmpdir(), 'locco-mongo-'));
    let child;
    const launch = async () => {
      const spawned = spawnLogged(binary, ['--port', String(port), '--storage-path', join(dir, 'data'), '--cache-size', '128M', '--log-file-max', '16MB', '--log-level', 'WARNING']);
      child = spawned.child;
      await listening(spawned, port, 30_000);
    };
    const kill = async (signal) => {
      if (child.exitCode === null && child.signalCode === null) {
        const exited = new Promise((r) => child.once('exit', r));
        child.kill(signal);
        await exited;
      }
    };
    const stop = async () => {
      await kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    };
    try {
      await launch();
    } catch (err) {
      await stop();
      throw err;
    }
    return {
      url: `mongodb://127.0.0.1:${port}/?directConnection=true`,
      name: 'secantusd-rs',
      get pid() {
        return child.pid;
      },
      /** Shuts the server down (SIGTERM) and starts it again on the same port and data. */
      async restart() {
        await kill('SIGTERM');
        await launch();
      },
      dispose: stop,
    };
  };
  return askedPort === undefined ? withRetries(start) : start();
}
