// Drives fair-child.mjs processes: each is one waiter in a process of its own.
import { fork } from 'node:child_process';

export function spawnWaiter(...argv) {
  const child = fork(new URL('./fair-child.mjs', import.meta.url), argv, { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  const inbox = [];
  const wanted = [];
  const violations = [];
  child.on('message', (m) => {
    if (process.env.FAIR_DEBUG) console.error(child.pid, JSON.stringify(m));
    if (m.event === 'violation') violations.push(m.message);
    const i = wanted.findIndex((w) => w.event === m.event);
    if (i >= 0) wanted.splice(i, 1)[0].resolve(m);
    else inbox.push(m);
  });
  const waiter = {
    child,
    violations,
    /** The next message of this kind, or a rejection after `ms`. */
    next(event, ms = 20_000) {
      const i = inbox.findIndex((m) => m.event === event);
      if (i >= 0) return Promise.resolve(inbox.splice(i, 1)[0]);
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => {
          const at = wanted.indexOf(w);
          if (at >= 0) wanted.splice(at, 1);
          reject(new Error(`no '${event}' from waiter ${child.pid} within ${ms} ms`));
        }, ms);
        const w = {
          event,
          resolve: (m) => {
            clearTimeout(timer);
            resolve(m);
          },
        };
        wanted.push(w);
      });
    },
    send: (m) => child.send(m),
    /** Has this event arrived (without waiting)? */
    has: (event) => inbox.some((m) => m.event === event),
    async exit() {
      if (child.exitCode !== null || child.signalCode) return;
      const gone = new Promise((r) => child.once('exit', r));
      child.send({ op: 'exit' });
      await Promise.race([gone, new Promise((r) => setTimeout(r, 3000))]);
      child.kill('SIGKILL');
    },
  };
  return waiter;
}

/** Starts `n` waiters and waits until each is connected. */
export async function waiters(n, ...argv) {
  const all = Array.from({ length: n }, () => spawnWaiter(...argv));
  await Promise.all(all.map((w) => w.next('ready')));
  return all;
}

/** Asks `w` for `key` and waits until it is queued (its first attempt found the key taken). */
export async function queueUp(w, key, ttl = 10_000, timeout = 30_000) {
  w.send({ op: 'acquire', key, ttl, timeout });
  await w.next('queued');
}
