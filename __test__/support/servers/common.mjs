// What the test servers share: free ports, waiting for a process to listen, retries on a port
// taken first, and spawning a server whose output is kept and which dies with the test process.
import { spawn, execFileSync } from 'node:child_process';
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { createServer } from 'node:net';

export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Whether process `pid` has a socket listening on TCP `port` (Linux: the listening sockets in
 * /proc/net/tcp*, matched by inode to the process's descriptors). A port that answers is not
 * proof that our server holds it: another process may have taken the free port first.
 */
function listensOn(pid, port) {
  const hexPort = `:${port.toString(16).toUpperCase().padStart(4, '0')}`;
  const inodes = new Set();
  for (const table of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let text = '';
    try {
      text = readFileSync(table, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      // sl local_address rem_address st ... inode: st 0A is LISTEN.
      const f = line.trim().split(/\s+/);
      if (f.length > 9 && f[1].endsWith(hexPort) && f[3] === '0A') inodes.add(f[9]);
    }
  }
  if (inodes.size === 0) return false;
  let fds = [];
  try {
    fds = readdirSync(`/proc/${pid}/fd`);
  } catch {
    return false;
  }
  return fds.some((fd) => {
    try {
      return inodes.has(/^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`))?.[1]);
    } catch {
      return false; // closed meanwhile
    }
  });
}

/**
 * Waits until `spawned`'s own process listens on `port`; fails at once, with its output, when it
 * exits first (a port another process holds, a bad flag), and after `ms` with its output too.
 */
export async function listening(spawned, port, ms) {
  const { child, output } = spawned;
  const end = Date.now() + ms;
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null) {
      throw new Error(`${child.spawnfile} exited (${child.exitCode ?? child.signalCode}) before it listened on port ${port}: ${output()}`);
    }
    if (listensOn(child.pid, port)) return;
    if (Date.now() > end) {
      child.kill('SIGKILL');
      throw new Error(`${child.spawnfile} did not listen on port ${port} in ${ms} ms: ${output()}`);
    }
    await sleep(50);
  }
}

/** `start(attempt)` until it succeeds, at most three times: a free port can be taken first. */
export async function withRetries(start) {
  for (let attempt = 1; ; attempt++) {
    try {
      return await start(attempt);
    } catch (err) {
      if (attempt === 3) throw err;
    }
  }
}

export function hasCommand(cmd) {
  try {
    execFileSync('sh', ['-c', `command -v ${cmd}`], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

/**
 * Servers still running. A test file whose set-up throws after it started one never reaches
 * its dispose; when the process ends they are killed, instead of living on as orphans. (An
 * exit handler runs on an uncaught error too, though not when the process itself is killed.)
 */
const running = new Set();
process.once('exit', () => {
  for (const child of running) child.kill('SIGKILL');
});

/**
 * Spawns `binary`, keeping the last few KB of its output. `ready(pattern, ms)` waits for a line
 * that matches, and fails at once, with that output, when the process exits first. (A port that
 * answers is not proof: another process may have taken the free port first.)
 */
export function spawnLogged(binary, args) {
  const child = spawn(binary, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  running.add(child);
  child.once('exit', () => running.delete(child));
  let tail = '';
  let onData = () => {};
  const keep = (chunk) => {
    tail = (tail + chunk).slice(-4000);
    onData();
  };
  child.stdout.setEncoding('utf8').on('data', keep);
  child.stderr.setEncoding('utf8').on('data', keep);
  const output = () => tail.trim() || '(no output)';
  const ready = (pattern, ms) =>
    new Promise((resolve, reject) => {
      const timer = setTimeout(() => done(new Error(`${binary} printed no ${pattern} in ${ms} ms: ${output()}`)), ms);
      const exited = (code, signal) => done(new Error(`${binary} exited (${code ?? signal}) before it was ready: ${output()}`));
      const done = (err) => {
        clearTimeout(timer);
        child.off('exit', exited);
        onData = () => {};
        if (err) reject(err);
        else resolve();
      };
      onData = () => {
        if (pattern.test(tail)) done();
      };
      child.once('exit', exited);
      onData();
    });
  return { child, output, ready };
}
