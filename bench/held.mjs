// Many locks held at once with autoExtend: how much they cost while nobody contends.
//   node bench/held.mjs [redis|postgres|mongo|memory] [count] [ttlMs] [holdSeconds]
// Defaults: redis, 1,000,000 locks, ttl 30 s (renewed every ttl/3), held 60 s. Reports the
// acquire time, Node's CPU (share of one core) and the server's during the hold, RSS, bytes
// per lock, and how many locks were lost (it must be 0).
import { readFileSync } from 'node:fs';
import { Locker } from 'locco-rs';
import { InMemoryAdapter } from 'locco-rs/memory';
import { startMongo, startPostgres, startRedis } from '../__test__/support/servers.mjs';

const [backend = 'redis', countArg, ttlArg, secondsArg] = process.argv.slice(2);
const COUNT = Number(countArg ?? 1_000_000);
const TTL = Number(ttlArg ?? 30_000);
const HOLD_S = Number(secondsArg ?? 60);
// Acquisitions in flight at once (HELD_IN_FLIGHT overrides it).
const IN_FLIGHT = Number(process.env.HELD_IN_FLIGHT ?? 4_096);

/** CPU seconds a process has used (utime + stime), read from /proc. */
function cpuSeconds(pid) {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100; // clock ticks: 100 per second on Linux
}

async function open() {
  if (backend === 'memory') return { adapter: new InMemoryAdapter(), async dispose() {} };
  if (backend === 'redis') {
    const server = await startRedis();
    const { RedisAdapter } = await import('locco-rs/redis');
    // The server's own count of the renewal scripts and the keys they extended (PEXPIREAT calls).
    const renewals = () => {
      const stats = server.cli('INFO', 'commandstats');
      const stat = (name) => {
        const m = new RegExp(`cmdstat_${name}:calls=(\\d+),usec=(\\d+)`).exec(stats);
        return m ? { calls: Number(m[1]), usec: Number(m[2]) } : { calls: 0, usec: 0 };
      };
      return { scripts: stat('evalsha'), keys: stat('pexpireat').calls };
    };
    return {
      adapter: new RedisAdapter({ url: server.url }),
      pid: server.pid,
      resetStats: () => server.cli('CONFIG', 'RESETSTAT'),
      renewals,
      dispose: () => server.dispose(),
    };
  }
  if (backend === 'postgres') {
    const server = await startPostgres();
    const { PostgresAdapter } = await import('locco-rs/postgres');
    return { adapter: new PostgresAdapter({ url: server.url }), dispose: () => server.dispose() };
  }
  if (backend === 'mongo') {
    const server = await startMongo();
    const { MongoAdapter } = await import('locco-rs/mongo');
    return { adapter: new MongoAdapter({ url: server.url }), pid: server.pid, dispose: () => server.dispose() };
  }
  throw new Error(`unknown backend ${backend}: redis, postgres, mongo or memory`);
}

const { adapter, pid, dispose, resetStats, renewals } = await open();
// A failure (an acquisition the server did not answer in time) still stops the server.
try {
  const locker = new Locker({ adapter, retry: { retries: 0 } });
  const rssBefore = process.memoryUsage().rss;
  const locks = new Array(COUNT);
  const t0 = performance.now();
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(IN_FLIGHT, COUNT) }, async () => {
      while (next < COUNT) {
        const i = next++;
        locks[i] = await locker.acquire(`held:${i}`, { ttl: TTL, autoExtend: { maxHold: 2 ** 31 - 1 } });
      }
    }),
  );
  const acquireS = (performance.now() - t0) / 1000;
  globalThis.gc?.();
  const cpu0 = process.cpuUsage();
  resetStats?.();
  const server0 = pid ? cpuSeconds(pid) : 0;
  const h0 = performance.now();
  let rssPeak = process.memoryUsage().rss;
  const sampler = setInterval(() => (rssPeak = Math.max(rssPeak, process.memoryUsage().rss)), 1000);
  await new Promise((r) => setTimeout(r, HOLD_S * 1000));
  clearInterval(sampler);
  const wall = (performance.now() - h0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  const nodeCpu = (cpu.user + cpu.system) / 1e6 / wall;
  const serverCpu = pid ? (cpuSeconds(pid) - server0) / wall : undefined;
  const renewed = renewals?.();
  const lost = locks.filter((l) => l.state !== 'held').length;
  const perLock = (rssPeak - rssBefore) / COUNT;
  const pct = (x) => `${(x * 100).toFixed(1)} %`;
  console.log(
    `${backend}: ${COUNT.toLocaleString('en-US')} locks, ttl ${TTL} ms, held ${HOLD_S} s: acquired in ${acquireS.toFixed(1)} s ` +
      `(${Math.round(COUNT / acquireS).toLocaleString('en-US')}/s); Node CPU ${pct(nodeCpu)} of a core` +
      (serverCpu === undefined ? '' : `, server CPU ${pct(serverCpu)}`) +
      `; RSS ${(rssPeak / 2 ** 20).toFixed(0)} MB (${Math.round(perLock)} B per lock); lost ${lost}`,
  );
  if (renewed) {
    const { scripts, keys } = renewed;
    console.log(
      `  renewals: ${Math.round(keys / wall).toLocaleString('en-US')} keys/s in ${Math.round(scripts.calls / wall)} script calls/s ` +
        `(${Math.round(keys / Math.max(scripts.calls, 1))} keys per call), ${(scripts.usec / Math.max(keys, 1)).toFixed(2)} µs of script time per key`,
    );
  }
  console.log(JSON.stringify({ backend, count: COUNT, ttl: TTL, holdS: HOLD_S, acquireS, nodeCpu, serverCpu, rssPeak, perLock, lost, renewed }));
  let i = 0;
  await Promise.all(
    Array.from({ length: IN_FLIGHT }, async () => {
      while (i < COUNT) await locks[i++].release().catch(() => {});
    }),
  );
} finally {
  await adapter.close?.();
  await dispose();
}
