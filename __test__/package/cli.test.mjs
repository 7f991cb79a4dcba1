// bin/locco-rs.js end to end: the tool runs in a child process against a Redis (and, for one
// case, a PostgreSQL) started here; the commands it runs are small Node scripts that record
// what happened to them in files of a temporary directory.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { freePort, makeTestCertificates, startEtcd, startMongo, startPostgres, startRedis, startRedisCluster, testProxy } from '../support/servers.mjs';

const root = new URL('../..', import.meta.url).pathname;
const bin = join(root, 'bin', 'locco-rs.js');
const node = process.execPath;
const dir = mkdtempSync(join(tmpdir(), 'locco-cli-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
let keys = 0;
const newKey = (name) => `cli-test:${name}:${process.pid}:${++keys}`;

/**
 * Starts `locco-rs <args>`. Answers { child, done, sofar }: done settles with { code, signal,
 * stdout, stderr, ms } when it exits (killed after `timeout` ms, which fails the test that
 * waits); sofar() shows what it printed until now, for a failure while it still runs.
 */
function start(args, { env = {}, timeout = 60_000 } = {}) {
  const began = Date.now();
  const child = spawn(node, [bin, ...args], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d) => (stdout += d));
  child.stderr.on('data', (d) => (stderr += d));
  const done = new Promise((resolve, reject) => {
    const timer = setTimeout(() => child.kill('SIGKILL'), timeout);
    child.on('error', reject);
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr, ms: Date.now() - began });
    });
  });
  const sofar = () => shown({ running: true, stdout, stderr, ms: Date.now() - began });
  return { child, done, sofar };
}

const cli = (args, options) => start(args, options).done;
const shown = (r) => `${r.running ? 'still running' : `exit ${r.code ?? r.signal}`} after ${r.ms} ms\n--- stdout\n${r.stdout}\n--- stderr\n${r.stderr}`;

/** Writes a Node script into the temp dir; answers its path. */
function script(name, source) {
  const file = join(dir, name);
  writeFileSync(file, source);
  return file;
}

/** Waits until `file` exists. */
async function waitForFile(file, ms = 30_000) {
  const end = Date.now() + ms;
  while (!existsSync(file)) {
    if (Date.now() > end) throw new Error(`${file} did not appear within ${ms} ms`);
    await sleep(25);
  }
}

// A command that writes `<ready>` with its pid, then waits until `<stop>` exists (at most `ms`),
// recording a SIGTERM it gets in `<ready>.term` (it then exits with `onTerm`, or, with
// `onTerm` 'ignore', keeps waiting).
const holder = script(
  'holder.mjs',
  `import { existsSync, writeFileSync } from 'node:fs';
const [ready, stop, ms, onTerm] = process.argv.slice(2);
process.on('SIGTERM', () => {
  writeFileSync(ready + '.term', String(Date.now()));
  if (onTerm !== 'ignore') process.exit(Number(onTerm));
});
writeFileSync(ready, String(process.pid));
const end = Date.now() + Number(ms);
const timer = setInterval(() => {
  if (existsSync(stop) || Date.now() > end) {
    clearInterval(timer);
    writeFileSync(ready + '.end', String(Date.now()));
  }
}, 20);
`,
);

// A command that appends "<name> start <t>", sleeps `ms`, then appends "<name> end <t>".
const appender = script(
  'appender.mjs',
  `import { appendFileSync } from 'node:fs';
const [file, name, ms] = process.argv.slice(2);
appendFileSync(file, name + ' start ' + Date.now() + '\\n');
setTimeout(() => appendFileSync(file, name + ' end ' + Date.now() + '\\n'), Number(ms));
`,
);

const printEnv = script('print-env.mjs', "console.log(process.env.LOCCO_FENCE ?? 'unset');\n");

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

describe('usage', () => {
  it('--help and run --help print the usage and the exit codes, and exit 0', async () => {
    for (const args of [['--help'], ['help'], ['run', '--help'], ['help', 'run']]) {
      const r = await cli(args);
      assert.equal(r.code, 0, shown(r));
      assert.match(r.stdout, /^Usage: locco-rs /, shown(r));
      for (const code of ['2', '3', '4', '5']) assert.match(r.stdout, new RegExp(`^  ${code} +\\S`, 'm'), shown(r));
    }
    const run = await cli(['run', '--help']);
    for (const option of ['--url', '--key', '--ttl', '--wait', '--fencing', '--grace']) assert.ok(run.stdout.includes(option), option);
  });

  it('every command\'s --help lists the backend options', async () => {
    const backend = ['--url', '--redlock', '--cluster', '--tls-ca', '--connect-timeout', '--command-timeout', '--server-timeout'];
    backend.push('--pg-mode', '--pg-keys', '--pg-table', '--mongo-db', '--mongo-collection', '--etcd-prefix');
    for (const command of ['run', 'inspect', 'release', 'doctor']) {
      const r = await cli([command, '--help']);
      assert.equal(r.code, 0, shown(r));
      for (const option of backend) assert.match(r.stdout, new RegExp(`^  ${option} `, 'm'), `${command} --help: ${option}`);
    }
  });

  it('--version prints the package version', async () => {
    const { version } = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
    const r = await cli(['--version']);
    assert.equal(r.code, 0, shown(r));
    assert.equal(r.stdout.trim(), version);
  });

  // No backend is contacted for any of these: the URL's port has nothing behind it.
  const url = 'redis://127.0.0.1:9';
  const cases = [
    [[], /Usage: locco-rs/],
    [['frob'], /unknown command "frob"/],
    [['run', '--key', 'k', '--', node, '-e', ''], /--url is required/],
    [['run', '--url', url, '--', node, '-e', ''], /--key is required/],
    [['run', '--url', url, '--key', 'k'], /no command/],
    [['run', '--url', url, '--key', 'k', node], /put the command after --/],
    [['run', '--url', url, '--key', 'k', '--bogus', '--', node], /--bogus/],
    [['run', '--url', url, '--key', 'k', '--ttl', '10x', '--', node], /--ttl "10x" is not a duration/],
    [['run', '--url', url, '--key', 'k', '--wait', '-1', '--', node], /--wait/],
    [['run', '--url', url, '--key', 'k', '--grace', '1.0001ms', '--', node], /--grace "1.0001ms" is not a duration/],
    [['run', '--url', url, '--key', 'k', '--ttl', '0', '--', node], /--ttl must be at least 1s/],
    [['run', '--url', url, '--key', 'k', '--ttl', '1', '--', node], /--ttl must be at least 1s, got 1ms/],
    [['run', '--url', url, '--key', 'k', '--fencng', '--', node], /unknown option --fencng for locco-rs run: did you mean --fencing\?/],
    [['inspect', '--url', url, '--prefx', 'jobs:'], /unknown option --prefx for locco-rs inspect: did you mean --prefix\?/],
    [['release', '--url', url, '--key', 'k', '--forse'], /did you mean --force\?/],
    [['run', '--url', url, '--key', 'k', '--label', 'cron', '--', node], /--holder <label>/],
    [['run', '--url', url, '--key', 'k', '--tls-cert', 'c.pem', '--', node], /client certificates are not supported/],
    [['rn', '--url', url], /unknown command "rn"; did you mean run\?/],
    [['run', '--url', url, '--url', 'redis://127.0.0.1:10', '--key', 'k', '--', node], /2 redis URLs: add --redlock .* or --cluster/],
    [['run', '--url', url, '--redlock', '--key', 'k', '--', node], /--url: .*Redlock needs at least 3/],
    [['run', '--url', url, '--redlock', '--cluster', '--key', 'k', '--', node], /--redlock or --cluster, not both/],
    [['run', '--url', url, '--pg-mode', 'advisory', '--key', 'k', '--', node], /--pg-mode applies to a postgres:\/\/ URL; not to a redis:\/\/ URL/],
    [['run', '--url', 'postgres://u:p@127.0.0.1:9/db', '--pg-mode', 'advisry', '--key', 'k', '--', node], /--pg-mode: .*'table' or 'advisory'/],
    [['run', '--url', 'postgres://u:p@127.0.0.1:9/db', '--redlock', '--key', 'k', '--', node], /--redlock applies to redis:\/\/ URLs/],
    [['run', '--url', 'mongodb://127.0.0.1:9', '--tls-ca', 'ca.pem', '--key', 'k', '--', node], /tlsCAFile/],
    [['run', '--url', 'rediss://127.0.0.1:9', '--tls-ca', '/nonexistent/ca.pem', '--key', 'k', '--', node], /--tls-ca "\/nonexistent\/ca.pem" cannot be read/],
    [['run', '--url', url, '--key', 'k', '--connect-timeout', 'soon', '--', node], /--connect-timeout "soon" is not a duration/],
    [['run', '--url', 'ftp://127.0.0.1', '--key', 'k', '--', node], /--url must start with one of redis:\/\/.*ftp:\/\/ is not one/],
    [['run', '--url', 'redis://127.0.0.1:99999', '--key', 'k', '--', node], /--url: .*port/],
    [['run', '--url', 'etcd://', '--key', 'k', '--', node], /etcd URL names no host/],
    [['run', '--url', url, '--key', 'k', '--', ''], /empty string/],
  ];
  for (const [args, message] of cases) {
    const shownArgs = args.length === 0 ? '(no arguments)' : args.map((a) => (a === node ? 'node' : a)).join(' ');
    it(`locco-rs ${shownArgs} exits 2`, async () => {
      const r = await cli(args);
      assert.equal(r.code, 2, shown(r));
      assert.match(r.stderr, message, shown(r));
    });
  }
});

describe('run against Redis', () => {
  let redis;
  before(async () => {
    redis = await startRedis();
  });
  after(() => redis?.dispose());
  const run = (key, options, command, startOptions) => start(['run', '--url', redis.url, '--key', key, ...options, '--', ...command], startOptions);

  it("exits with the command's exit code, and 128+n when a signal killed it", async () => {
    const key = newKey('code');
    const r = await run(key, [], [node, '-e', 'process.exit(42)']).done;
    assert.equal(r.code, 42, shown(r));
    const killed = await run(key, [], [node, '-e', "process.kill(process.pid, 'SIGKILL')"]).done;
    assert.equal(killed.code, 128 + 9, shown(killed));
    const ok = await run(key, [], [node, '-e', '']).done;
    assert.equal(ok.code, 0, shown(ok));
    assert.equal(redis.cli('EXISTS', key), '0', 'the lock was not released');
  });

  it('a command that exits 4 by itself keeps its code, is not reported as a lost lock, and the key is released', async () => {
    const key = newKey('own-4');
    const r = await run(key, [], [node, '-e', 'process.exit(4)']).done;
    assert.equal(r.code, 4, shown(r));
    assert.doesNotMatch(r.stderr, /lost/);
    assert.equal(redis.cli('EXISTS', key), '0', 'the lock was not released');
  });

  it('a signal while waiting for a held key ends the wait with 128+n; the command never starts', async () => {
    const key = newKey('wait-signal');
    const ready = join(dir, `${key}.ready`);
    const stop = join(dir, `${key}.stop`);
    const first = run(key, [], [node, holder, ready, stop, '30000', '0']);
    try {
      await waitForFile(ready);
      const marker = join(dir, `${key}.ran`);
      const waiting = run(key, ['--wait', '60s'], [node, '-e', `require('fs').writeFileSync(${JSON.stringify(marker)}, '')`]);
      // It waits once it stands in the key's queue of waiters (the Redis adapter's list
      // `<key>:locco-q`); its signal handlers are in place before its first attempt.
      const end = Date.now() + 30_000;
      while (redis.cli('LLEN', `${key}:locco-q`) === '0') {
        assert.ok(Date.now() < end, 'the second run never queued for the key');
        await sleep(50);
      }
      waiting.child.kill('SIGTERM');
      const r = await waiting.done;
      assert.equal(r.code, 128 + 15, shown(r));
      assert.ok(r.ms < 30_000, shown(r));
      assert.equal(existsSync(marker), false, 'the command ran');
    } finally {
      writeFileSync(stop, '');
    }
    assert.equal((await first.done).code, 0);
  });

  it('a run that waits says every few seconds on stderr whom it waits for, then runs once the key is free', async () => {
    const key = newKey('wait-report');
    const ready = join(dir, `${key}.ready`);
    const stop = join(dir, `${key}.stop`);
    const first = start(['run', '--url', redis.url, '--key', key, '--holder', 'nightly import', '--', node, holder, ready, stop, '30000', '0']);
    try {
      await waitForFile(ready);
      const marker = join(dir, `${key}.ran`);
      const waiting = run(key, ['--wait', '60s'], [node, '-e', `require('fs').writeFileSync(${JSON.stringify(marker)}, '')`]);
      // The first report comes 5 s into the wait.
      const end = Date.now() + 20_000;
      while (!/waiting for/.test(waiting.sofar())) {
        assert.ok(Date.now() < end, waiting.sofar());
        await sleep(100);
      }
      assert.match(waiting.sofar(), new RegExp(`locco-rs: waiting for "${key}": held by "nightly import", [\\d.]+m?s left on its lease \\(waited [\\d.]+s of 1m\\)`));
      writeFileSync(stop, '');
      const r = await waiting.done;
      assert.equal(r.code, 0, shown(r));
      assert.equal(existsSync(marker), true, 'the command never ran');
    } finally {
      writeFileSync(stop, '');
    }
    assert.equal((await first.done).code, 0);
  });

  it('exits 127 when the command does not exist, and releases the lock', async () => {
    const key = newKey('missing');
    const r = await run(key, [], [join(dir, 'no-such-command')]).done;
    assert.equal(r.code, 127, shown(r));
    assert.match(r.stderr, /cannot run/);
    assert.equal(redis.cli('EXISTS', key), '0');
  });

  it('holds the key while the command runs and releases it afterwards', async () => {
    const key = newKey('held');
    const ready = join(dir, `${key}.ready`);
    const stop = join(dir, `${key}.stop`);
    const first = run(key, [], [node, holder, ready, stop, '30000', '0']);
    await waitForFile(ready);
    assert.equal(redis.cli('EXISTS', key), '1');
    writeFileSync(stop, '');
    const r = await first.done;
    assert.equal(r.code, 0, shown(r));
    assert.equal(redis.cli('EXISTS', key), '0');
  });

  it('--wait 0 on a held key exits 3 at once, naming the key; --wait 1s exits 3 after about 1 s', async () => {
    const key = newKey('busy');
    const ready = join(dir, `${key}.ready`);
    const stop = join(dir, `${key}.stop`);
    const first = run(key, [], [node, holder, ready, stop, '30000', '0']);
    try {
      await waitForFile(ready);
      const marker = join(dir, `${key}.second-ran`);
      const second = await run(key, ['--wait', '0'], [node, '-e', `require('fs').writeFileSync(${JSON.stringify(marker)}, '')`]).done;
      assert.equal(second.code, 3, shown(second));
      assert.ok(second.stderr.includes(JSON.stringify(key)), shown(second));
      assert.match(second.stderr, /held/);
      assert.equal(existsSync(marker), false, 'the second command ran without the lock');
      const waited = await run(key, ['--wait', '1s'], [node, '-e', `require('fs').writeFileSync(${JSON.stringify(marker)}, '')`]).done;
      assert.equal(waited.code, 3, shown(waited));
      assert.ok(waited.ms >= 1000, shown(waited));
      assert.equal(existsSync(marker), false, 'the waiting command ran without the lock');
    } finally {
      writeFileSync(stop, '');
    }
    assert.equal((await first.done).code, 0);
  });

  it('two runs on one key with --wait take turns: the second starts after the first ended', async () => {
    const key = newKey('serial');
    const log = join(dir, `${key}.log`);
    const a = run(key, ['--wait', '30s'], [node, appender, log, 'A', '1500']);
    // B starts once A's command runs, so it has to wait for A's lock.
    const end = Date.now() + 30_000;
    while (!(existsSync(log) && readFileSync(log, 'utf8').includes('A start'))) {
      assert.ok(Date.now() < end, 'A never started');
      await sleep(25);
    }
    const b = run(key, ['--wait', '30s'], [node, appender, log, 'B', '200']);
    const [ra, rb] = await Promise.all([a.done, b.done]);
    assert.equal(ra.code, 0, shown(ra));
    assert.equal(rb.code, 0, shown(rb));
    const lines = readFileSync(log, 'utf8').trim().split('\n').map((l) => l.split(' '));
    assert.deepEqual(lines.map(([name, what]) => `${name} ${what}`), ['A start', 'A end', 'B start', 'B end']);
    const at = Object.fromEntries(lines.map(([name, what, t]) => [`${name} ${what}`, Number(t)]));
    assert.ok(at['B start'] >= at['A end'], `B started at ${at['B start']}, A ended at ${at['A end']}`);
  });

  it('passes a positive fencing token in LOCCO_FENCE with --fencing, growing per grant; none without', async () => {
    const key = newKey('fence');
    const one = await run(key, ['--fencing'], [node, printEnv]).done;
    const two = await run(key, ['--fencing'], [node, printEnv]).done;
    assert.equal(one.code, 0, shown(one));
    assert.equal(two.code, 0, shown(two));
    assert.match(one.stdout.trim(), /^[1-9]\d*$/);
    assert.ok(Number(two.stdout.trim()) > Number(one.stdout.trim()), `${one.stdout} then ${two.stdout}`);
    const plain = await run(key, [], [node, printEnv]).done;
    assert.equal(plain.stdout.trim(), 'unset');
  });

  it('a lost lock stops the command: SIGTERM, SIGKILL after --grace, exit 4', async () => {
    const key = newKey('lost');
    const ready = join(dir, `${key}.ready`);
    // The command ignores SIGTERM and would run for 60 s.
    const r = run(key, ['--ttl', '1s', '--grace', '1s'], [node, holder, ready, join(dir, `${key}.never`), '60000', 'ignore']);
    await waitForFile(ready);
    const pid = Number(readFileSync(ready, 'utf8'));
    const deleted = Date.now();
    assert.equal(redis.cli('DEL', key), '1');
    const out = await r.done;
    assert.equal(out.code, 4, shown(out));
    assert.match(out.stderr, /was lost/, shown(out));
    // The loss shows at the next extension (a third of the ttl), then 1 s of grace.
    const took = Date.now() - deleted;
    assert.ok(took < 20_000, `stopped ${took} ms after the key was deleted\n${shown(out)}`);
    assert.ok(existsSync(`${ready}.term`), 'the command got no SIGTERM');
    assert.ok(Number(readFileSync(`${ready}.term`, 'utf8')) - deleted < 15_000);
    assert.equal(existsSync(`${ready}.end`), false, 'the command ran to its end');
    assert.equal(alive(pid), false, 'the command still runs');
  });

  it('a lost lock with a command that obeys SIGTERM: exit 4, not the command code', async () => {
    const key = newKey('lost-term');
    const ready = join(dir, `${key}.ready`);
    const r = run(key, ['--ttl', '1s', '--grace', '30s'], [node, holder, ready, join(dir, `${key}.never`), '60000', '0']);
    await waitForFile(ready);
    redis.cli('DEL', key);
    const out = await r.done;
    assert.equal(out.code, 4, shown(out));
    assert.ok(existsSync(`${ready}.term`), 'the command got no SIGTERM');
    assert.ok(out.ms < 30_000, `SIGTERM should have been enough\n${shown(out)}`);
  });

  it('a lock taken away while the command runs, which then ends before the next extension: exit 4, the loss said', async () => {
    const key = newKey('gone-quietly');
    const ready = join(dir, `${key}.ready`);
    const stop = join(dir, `${key}.stop`);
    // A 30 s lease: its first extension is 10 s away, long after the command ended.
    const r = run(key, ['--ttl', '30s'], [node, holder, ready, stop, '30000', '0']);
    try {
      await waitForFile(ready);
      const forced = await cli(['release', '--url', redis.url, '--key', key, '--force']);
      assert.equal(forced.code, 0, shown(forced));
    } finally {
      writeFileSync(stop, '');
    }
    const out = await r.done;
    assert.equal(out.code, 4, shown(out));
    assert.match(out.stderr, /was lost/, shown(out));
    assert.ok(out.ms < 10_000, `ended by the extension, not the release\n${shown(out)}`);
  });

  it('a signal that arrives during the final release does not stop it: the key is released, the code kept', async () => {
    const key = newKey('signal-in-release');
    const ready = join(dir, `${key}.ready`);
    const stop = join(dir, `${key}.stop`);
    const proxy = await testProxy(Number(new URL(redis.url).port));
    try {
      const r = start(['run', '--url', proxy.urlFor(redis.url), '--key', key, '--', node, holder, ready, stop, '30000', '9']);
      await waitForFile(ready);
      assert.equal(redis.cli('EXISTS', key), '1');
      // The release's request is held on its way for 3 s; both signals land while it is.
      const stalled = proxy.stall(3000);
      writeFileSync(stop, '');
      await waitForFile(`${ready}.end`);
      await sleep(700);
      r.child.kill('SIGTERM');
      await sleep(300);
      r.child.kill('SIGINT');
      await stalled;
      const out = await r.done;
      assert.equal(out.signal, null, shown(out));
      assert.equal(out.code, 0, shown(out));
      assert.equal(redis.cli('EXISTS', key), '0', 'the lock was not released');
    } finally {
      writeFileSync(stop, '');
      await proxy.close();
    }
  });

  it('on Linux the command dies with locco-rs: SIGKILL to locco-rs leaves no command running without the lock', { skip: process.platform !== 'linux' }, async () => {
    const key = newKey('orphan');
    const ready = join(dir, `${key}.ready`);
    const r = run(key, [], [node, holder, ready, join(dir, `${key}.never`), '60000', '0']);
    await waitForFile(ready);
    const pid = Number(readFileSync(ready, 'utf8'));
    try {
      // Its exit, not its close: the command shares its output pipes and would hold those open.
      const exited = new Promise((resolve) => r.child.once('exit', resolve));
      r.child.kill('SIGKILL');
      await exited;
      const end = Date.now() + 3000;
      while (alive(pid) && Date.now() < end) await sleep(50);
      assert.equal(alive(pid), false, 'the command outlived locco-rs');
    } finally {
      if (alive(pid)) process.kill(pid, 'SIGKILL');
    }
  });

  it('a second SIGINT kills a command that ignores the first: exit 137, the lock released', async () => {
    const key = newKey('second-interrupt');
    const ready = join(dir, `${key}.ready`);
    const stubborn = script(
      'stubborn.mjs',
      `import { appendFileSync, writeFileSync } from 'node:fs';
const ready = process.argv[2];
process.on('SIGINT', () => appendFileSync(ready + '.int', 'x'));
writeFileSync(ready, String(process.pid));
setTimeout(() => {}, 60_000);
`,
    );
    const r = run(key, [], [node, stubborn, ready], { timeout: 20_000 });
    await waitForFile(ready);
    const pid = Number(readFileSync(ready, 'utf8'));
    try {
      r.child.kill('SIGINT');
      await waitForFile(`${ready}.int`);
      await sleep(300);
      assert.equal(alive(pid), true, 'the first SIGINT is passed on, not escalated');
      r.child.kill('SIGINT');
      const out = await r.done;
      assert.equal(out.code, 128 + 9, shown(out));
      assert.ok(out.ms < 15_000, shown(out));
      assert.equal(alive(pid), false, 'the command still runs');
      assert.equal(redis.cli('EXISTS', key), '0', 'the lock was not released');
    } finally {
      if (alive(pid)) process.kill(pid, 'SIGKILL');
    }
  });

  for (const signal of ['SIGTERM', 'SIGINT', 'SIGHUP']) {
    it(`${signal} sent to locco-rs reaches the command, whose exit code is kept; the lock is released`, async () => {
      const key = newKey(signal);
      const ready = join(dir, `${key}.ready`);
      const handler = script(
        `${signal}.mjs`,
        `import { writeFileSync } from 'node:fs';
process.on(${JSON.stringify(signal)}, () => { writeFileSync(${JSON.stringify(`${ready}.got`)}, ''); process.exit(7); });
writeFileSync(${JSON.stringify(ready)}, '');
setTimeout(() => {}, 60_000);
`,
      );
      const r = run(key, [], [node, handler]);
      await waitForFile(ready);
      r.child.kill(signal);
      const out = await r.done;
      assert.equal(out.code, 7, shown(out));
      assert.ok(existsSync(`${ready}.got`), `the command did not get ${signal}`);
      assert.equal(redis.cli('EXISTS', key), '0', 'the lock was not released');
    });
  }

  it('a command killed by the signal passed on exits 128+n', async () => {
    const key = newKey('term-default');
    const ready = join(dir, `${key}.ready`);
    const r = run(key, [], [node, '-e', `require('fs').writeFileSync(${JSON.stringify(ready)}, ''); setTimeout(() => {}, 60000)`]);
    await waitForFile(ready);
    r.child.kill('SIGTERM');
    const out = await r.done;
    assert.equal(out.code, 128 + 15, shown(out));
    assert.ok(out.ms < 30_000);
  });

  it("docs/cli.md's example runs as written", async () => {
    const readme = readFileSync(join(root, 'docs', 'cli.md'), 'utf8');
    const section = readme.slice(readme.indexOf('# Command line\n'));
    const block = /\n```sh\n([\s\S]*?)\n```\n/.exec(section)?.[1];
    assert.ok(block?.includes('npx locco-rs run'), 'the Command line section has no sh block running npx locco-rs');
    const cwd = mkdtempSync(join(dir, 'readme-'));
    writeFileSync(join(cwd, 'report.js'), "require('fs').writeFileSync('report.done', process.env.REDIS_URL ? 'ran' : '');\n");
    // npx, as a shell function: the command this checkout would install.
    const npx = `npx() { [ "$1" = locco-rs ] || exit 99; shift; "$LOCCO_NODE" "$LOCCO_BIN" "$@"; }\n`;
    const r = await new Promise((resolve, reject) => {
      const child = spawn('sh', ['-c', npx + block], {
        cwd,
        env: { ...process.env, REDIS_URL: redis.url, LOCCO_NODE: node, LOCCO_BIN: bin, PATH: `${dirname(node)}:${process.env.PATH}` },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let out = '';
      child.stdout.on('data', (d) => (out += d));
      child.stderr.on('data', (d) => (out += d));
      child.on('error', reject);
      child.on('close', (code) => resolve({ code, out }));
    });
    assert.equal(r.code, 0, r.out);
    assert.equal(readFileSync(join(cwd, 'report.done'), 'utf8'), 'ran');
    assert.equal(redis.cli('EXISTS', 'nightly-report'), '0', 'the lock was not released');
  });

  it('a backend that cannot be reached exits 5', async () => {
    const port = await freePort(); // nothing listens there
    const r = await cli(['run', '--url', `redis://127.0.0.1:${port}`, '--key', newKey('down'), '--', node, '-e', '']);
    assert.equal(r.code, 5, shown(r));
    assert.match(r.stderr, /backend error/, shown(r));
  });
});

describe('run against PostgreSQL', () => {
  let pg;
  before(async () => {
    pg = await startPostgres();
  });
  after(() => pg?.dispose());

  it('holds the key for the command, refuses a second holder (exit 3), and fences', async () => {
    const key = newKey('pg');
    const ready = join(dir, `${key}.ready`);
    const stop = join(dir, `${key}.stop`);
    const base = ['run', '--url', pg.url, '--key', key];
    const first = start([...base, '--fencing', '--', node, holder, ready, stop, '30000', '0']);
    try {
      await waitForFile(ready);
      const second = await cli([...base, '--', node, '-e', '']);
      assert.equal(second.code, 3, shown(second));
      assert.ok(second.stderr.includes(JSON.stringify(key)), shown(second));
    } finally {
      writeFileSync(stop, '');
    }
    assert.equal((await first.done).code, 0);
    const fenced = await cli([...base, '--fencing', '--', node, printEnv]);
    assert.equal(fenced.code, 0, shown(fenced));
    assert.match(fenced.stdout.trim(), /^[1-9]\d*$/);
    // The URL carries a password; locco-rs never prints it.
    assert.doesNotMatch(fenced.stderr + fenced.stdout, /postgres-pw/);
  });

  it('the URL can come from LOCCO_URL instead of --url', async () => {
    const r = await cli(['run', '--key', newKey('env'), '--', node, '-e', 'process.exit(3 + 8)'], { env: { LOCCO_URL: pg.url } });
    assert.equal(r.code, 11, shown(r));
  });
});

/** Polls `check` every 50 ms until it is true; throws `what` after `ms`. */
async function until(check, what, ms = 15_000) {
  const end = Date.now() + ms;
  while (!check()) {
    if (Date.now() > end) throw new Error(`${what} did not happen within ${ms} ms`);
    await sleep(50);
  }
}

describe('run over Redlock', () => {
  let servers;
  before(async () => {
    servers = await Promise.all([startRedis(), startRedis(), startRedis()]);
  });
  after(() => Promise.all((servers ?? []).map((s) => s.dispose())));
  const backend = () => ['--redlock', ...servers.flatMap((s) => ['--url', s.url])];

  it('holds the key on the three servers for the command, refuses a second holder (exit 3), and inspect shows its holder', async () => {
    const key = newKey('redlock');
    const ready = join(dir, `${key}.ready`);
    const stop = join(dir, `${key}.stop`);
    const first = start(['run', ...backend(), '--key', key, '--holder', 'redlock job', '--', node, holder, ready, stop, '30000', '0']);
    try {
      await waitForFile(ready);
      assert.deepEqual(servers.map((s) => s.cli('EXISTS', key)), ['1', '1', '1'], first.sofar());
      const second = await cli(['run', ...backend(), '--key', key, '--', node, '-e', '']);
      assert.equal(second.code, 3, shown(second));
      assert.ok(second.stderr.includes(JSON.stringify(key)), shown(second));
      const inspected = await cli(['inspect', ...backend(), '--key', key, '--json']);
      assert.equal(inspected.code, 0, shown(inspected));
      const info = JSON.parse(inspected.stdout);
      assert.equal(info.held, true, shown(inspected));
      assert.equal(info.holder, 'redlock job', shown(inspected));
    } finally {
      writeFileSync(stop, '');
    }
    const r = await first.done;
    assert.equal(r.code, 0, shown(r));
    assert.deepEqual(servers.map((s) => s.cli('EXISTS', key)), ['0', '0', '0']);
  });

  it('LOCCO_URL may hold the servers separated by spaces; --fencing is a usage error, as Redlock has no fencing tokens', async () => {
    const env = { LOCCO_URL: servers.map((s) => s.url).join(' ') };
    const r = await cli(['run', '--redlock', '--key', newKey('redlock-env'), '--', node, '-e', 'process.exit(7)'], { env });
    assert.equal(r.code, 7, shown(r));
    const fenced = await cli(['run', ...backend(), '--fencing', '--key', newKey('redlock-fence'), '--', node, '-e', '']);
    assert.equal(fenced.code, 2, shown(fenced));
    assert.match(fenced.stderr, /fencing/, shown(fenced));
  });
});

describe('run on a Redis Cluster', () => {
  let cluster;
  before(async () => {
    cluster = await startRedisCluster({ size: 3 });
  });
  after(() => cluster?.dispose());

  it('--cluster with one seed node: holds the key for the command, refuses a second holder (exit 3), and inspect finds it', async () => {
    const key = newKey('cluster');
    const ready = join(dir, `${key}.ready`);
    const stop = join(dir, `${key}.stop`);
    const backend = ['--cluster', '--url', cluster.urls[0]];
    const first = start(['run', ...backend, '--key', key, '--holder', 'cluster job', '--', node, holder, ready, stop, '30000', '0']);
    try {
      await waitForFile(ready);
      const second = await cli(['run', ...backend, '--key', key, '--', node, '-e', '']);
      assert.equal(second.code, 3, shown(second));
      const info = JSON.parse((await cli(['inspect', ...backend, '--key', key, '--json'])).stdout);
      assert.equal(info.held, true);
      assert.equal(info.holder, 'cluster job');
    } finally {
      writeFileSync(stop, '');
    }
    const r = await first.done;
    assert.equal(r.code, 0, shown(r));
    const after = await cli(['inspect', ...backend, '--key', key]);
    assert.match(after.stdout, /is free/, shown(after));
  });
});

describe('run over TLS', () => {
  let redis;
  let pg;
  let caFile;
  before(async () => {
    const certs = makeTestCertificates();
    caFile = join(dir, 'test-ca.pem');
    writeFileSync(caFile, certs.ca);
    redis = await startRedis({
      tlsPort: await freePort(),
      args: ['--tls-cert-file', certs.certFile, '--tls-key-file', certs.keyFile, '--tls-auth-clients', 'no'],
    });
    pg = await startPostgres({ ssl: { cert: certs.cert, key: certs.key } });
  });
  after(async () => {
    await redis?.dispose();
    await pg?.dispose();
  });

  it('rediss:// with --tls-ca runs the command under the lock; without the CA the server is not trusted (exit 5)', async () => {
    const url = `rediss://localhost:${redis.port}`;
    const r = await cli(['run', '--url', url, '--tls-ca', caFile, '--key', newKey('tls'), '--', node, '-e', 'process.exit(9)']);
    assert.equal(r.code, 9, shown(r));
    const untrusted = await cli(['run', '--url', url, '--connect-timeout', '2s', '--key', newKey('tls'), '--', node, '-e', '']);
    assert.equal(untrusted.code, 5, shown(untrusted));
  });

  it('PostgreSQL with sslmode=verify-full and --tls-ca runs the command under the lock', async () => {
    const url = `${pg.url.replace('127.0.0.1', 'localhost')}?sslmode=verify-full`;
    const r = await cli(['run', '--url', url, '--tls-ca', caFile, '--key', newKey('pg-tls'), '--', node, '-e', 'process.exit(9)']);
    assert.equal(r.code, 9, shown(r));
    const untrusted = await cli(['run', '--url', url, '--key', newKey('pg-tls'), '--', node, '-e', '']);
    assert.equal(untrusted.code, 5, shown(untrusted));
  });
});

describe('run with PostgreSQL advisory locks', () => {
  let pg;
  before(async () => {
    pg = await startPostgres();
  });
  after(() => pg?.dispose());
  const advisoryLocks = () => Number(pg.psql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"));

  it('--pg-mode advisory holds a session advisory lock for the command, refuses a second holder (exit 3), and inspect shows its holder', async () => {
    const key = newKey('advisory');
    const ready = join(dir, `${key}.ready`);
    const stop = join(dir, `${key}.stop`);
    const backend = ['--url', pg.url, '--pg-mode', 'advisory'];
    const first = start(['run', ...backend, '--key', key, '--holder', 'migration', '--', node, holder, ready, stop, '30000', '0']);
    try {
      await waitForFile(ready);
      assert.equal(advisoryLocks(), 1, first.sofar());
      const second = await cli(['run', ...backend, '--key', key, '--', node, '-e', '']);
      assert.equal(second.code, 3, shown(second));
      const inspected = await cli(['inspect', ...backend, '--key', key, '--json']);
      assert.equal(inspected.code, 0, shown(inspected));
      const info = JSON.parse(inspected.stdout);
      assert.equal(info.held, true, shown(inspected));
      assert.equal(info.holder, 'migration', shown(inspected));
    } finally {
      writeFileSync(stop, '');
    }
    const r = await first.done;
    assert.equal(r.code, 0, shown(r));
    await until(() => advisoryLocks() === 0, 'the advisory lock going');
  });

  it('--pg-keys integer locks the number itself: a psql session holding pg_advisory_lock(N) makes run exit 3', async () => {
    const session = pg.session('SELECT pg_advisory_lock(424242); SELECT pg_sleep(60);\n');
    try {
      await until(() => advisoryLocks() === 1, 'psql taking the advisory lock');
      const backend = ['--url', pg.url, '--pg-mode', 'advisory', '--pg-keys', 'integer'];
      const r = await cli(['run', ...backend, '--key', '424242', '--', node, '-e', '']);
      assert.equal(r.code, 3, shown(r));
      const other = await cli(['run', ...backend, '--key', '424243', '--', node, '-e', 'process.exit(6 + 6)']);
      assert.equal(other.code, 12, shown(other));
    } finally {
      session.kill();
    }
  });
});

// The other schemes: etcd:// is mapped to EtcdAdapter's endpoints, mongodb:// goes as it is.
const others = [
  ['etcd', startEtcd, (server) => `etcd://${server.endpoint}`],
  ['MongoDB', startMongo, (server) => server.url],
];
for (const [name, startServer, urlOf] of others) {
  describe(`run against ${name}`, () => {
    let server;
    before(async () => {
      server = await startServer();
    });
    after(() => server?.dispose());

    it('holds the key for the command, refuses a second holder (exit 3), and fences', async () => {
      const key = newKey(name);
      const ready = join(dir, `${key}.ready`);
      const stop = join(dir, `${key}.stop`);
      const base = ['run', '--url', urlOf(server), '--key', key];
      const first = start([...base, '--', node, holder, ready, stop, '30000', '5']);
      try {
        await waitForFile(ready);
        const second = await cli([...base, '--', node, '-e', '']);
        assert.equal(second.code, 3, shown(second));
      } finally {
        writeFileSync(stop, '');
      }
      const r = await first.done;
      assert.equal(r.code, 0, shown(r));
      const fenced = await cli([...base, '--fencing', '--', node, printEnv]);
      assert.equal(fenced.code, 0, shown(fenced));
      assert.match(fenced.stdout.trim(), /^[1-9]\d*$/);
    });
  });
}

describe('inspect and release', () => {
  let redis;
  let pg;
  before(async () => {
    redis = await startRedis();
    pg = await startPostgres();
  });
  after(async () => {
    await redis?.dispose();
    await pg?.dispose();
  });

  it('--help of each prints its options and exit codes; mistakes exit 2 before any backend is asked', async () => {
    for (const [command, options] of [
      ['inspect', ['--url', '--key', '--prefix', '--limit', '--permits', '--read-write', '--max-readers', '--json']],
      ['release', ['--url', '--key', '--force']],
    ]) {
      const r = await cli([command, '--help']);
      assert.equal(r.code, 0, shown(r));
      assert.match(r.stdout, new RegExp(`^Usage: locco-rs ${command} `), shown(r));
      for (const o of options) assert.ok(r.stdout.includes(o), `${command} ${o}`);
      assert.match(r.stdout, /^Exit codes:/m);
    }
    const url = 'redis://127.0.0.1:9';
    for (const [args, message] of [
      [['inspect'], /--url is required/],
      [['inspect', '--url', url, '--limit', '0'], /--limit "0"/],
      [['inspect', '--url', url, '--key', 'a', '--prefix', 'b'], /--key or --prefix, not both/],
      [['inspect', '--url', url, '--permits', '3'], /--permits needs --key/],
      [['inspect', '--url', url, '--key', 'a', '--permits', 'x'], /--permits "x"/],
      [['inspect', '--url', url, '--key', 'a', '--permits', '3', '--read-write'], /not both/],
      [['inspect', '--url', url, '--key', 'a', '--max-readers', '4'], /--max-readers goes with --read-write/],
      [['release', '--url', url], /--key is required/],
      [['release', '--url', url, '--key', 'k', 'extra'], /extra/],
    ]) {
      const r = await cli(args);
      assert.equal(r.code, 2, shown(r));
      assert.match(r.stderr, message, shown(r));
    }
  });

  it('inspect --permits and --read-write show a semaphore and a read-write lock as what they are', async () => {
    const { Locker } = await import('locco-rs');
    const { RedisAdapter } = await import('locco-rs/redis');
    const adapter = new RedisAdapter({ url: redis.url });
    const locker = new Locker({ adapter });
    const key = newKey('sem');
    try {
      const held = [await locker.acquirePermit(key, { limit: 3, ttl: 30_000, holder: 'export job 1' }), await locker.acquirePermit(key, { limit: 3, ttl: 30_000, holder: 'export job 2' })];
      let r = await cli(['inspect', '--url', redis.url, '--key', key, '--permits', '3']);
      assert.equal(r.code, 0, shown(r));
      assert.match(r.stdout, new RegExp(`^semaphore "${key}": 2 of 3 permits held`), shown(r));
      assert.match(r.stdout, /export job 1/);
      assert.match(r.stdout, /export job 2/);
      r = await cli(['inspect', '--url', redis.url, '--key', key, '--permits', '3', '--json']);
      const json = JSON.parse(r.stdout);
      assert.equal(json.held, 2);
      assert.deepEqual(json.holders.map((h) => h.holder).sort(), ['export job 1', 'export job 2']);
      await Promise.all(held.map((l) => l.release()));
      const reader = await locker.acquireRead(`${key}:doc`, { ttl: 30_000, maxReaders: 4, holder: 'reader one' });
      r = await cli(['inspect', '--url', redis.url, '--key', `${key}:doc`, '--read-write', '--max-readers', '4']);
      assert.equal(r.code, 0, shown(r));
      assert.match(r.stdout, /: no writer, 1 reader\(s\)/, shown(r));
      assert.match(r.stdout, /reader one/, shown(r));
      await reader.release();
    } finally {
      await locker.close();
      await adapter.close();
    }
  });

  for (const backend of ['Redis', 'PostgreSQL']) {
    it(`${backend}: inspect shows a key another process holds, with its holder; release refuses without --force, frees it with it`, async () => {
      const url = backend === 'Redis' ? redis.url : pg.url;
      const prefix = newKey('ops');
      const key = `${prefix}:report`;
      const ready = join(dir, `${key}.ready`);
      const stop = join(dir, `${key}.stop`);
      // The holder: a locco-rs run in its own process, extending a 3 s lease every second.
      const holding = start(['run', '--url', url, '--key', key, '--ttl', '3s', '--holder', 'nightly report (pid 7)', '--', node, holder, ready, stop, '30000', '0']);
      try {
        await waitForFile(ready);
        const listed = await cli(['inspect', '--url', url, '--prefix', prefix]);
        assert.equal(listed.code, 0, shown(listed));
        const [head, row, ...rest] = listed.stdout.trim().split('\n');
        assert.match(head, /^KEY +TTL LEFT +FENCE +HOLDER$/, shown(listed));
        assert.deepEqual(rest, [], shown(listed));
        assert.ok(row.startsWith(key), shown(listed));
        assert.match(row, / (\d(\.\d)?s|\d+ms) +- +nightly report \(pid 7\)$/, shown(listed));
        const json = await cli(['inspect', '--url', url, '--key', key, '--json']);
        assert.equal(json.code, 0, shown(json));
        const info = JSON.parse(json.stdout);
        assert.equal(info.key, key);
        assert.equal(info.held, true);
        assert.equal(info.holder, 'nightly report (pid 7)');
        assert.ok(info.ttlLeft > 0 && info.ttlLeft <= 3000, shown(json));
        assert.equal(Object.hasOwn(info, 'token'), false);

        const refused = await cli(['release', '--url', url, '--key', key]);
        assert.equal(refused.code, 2, shown(refused));
        assert.match(refused.stderr, /would remove the lease on .* held by "nightly report \(pid 7\)"/, shown(refused));
        assert.match(refused.stderr, /--force/, shown(refused));
        // Still held, by the same process, well past its next extensions.
        await sleep(1500);
        const still = await cli(['inspect', '--url', url, '--key', key, '--json']);
        assert.equal(JSON.parse(still.stdout).held, true, `${shown(still)}\n--- the first inspect's ttlLeft: ${info.ttlLeft} ms\n--- the holder\n${holding.sofar()}`);
        assert.equal(existsSync(`${ready}.term`), false);

        const forced = await cli(['release', '--url', url, '--key', key, '--force']);
        assert.equal(forced.code, 0, shown(forced));
        assert.match(forced.stdout, /^released .* held by "nightly report \(pid 7\)"/, shown(forced));
        // The holder learns it at its next extension: its command is stopped, it exits with 4.
        const r = await holding.done;
        assert.equal(r.code, 4, shown(r));
        assert.match(r.stderr, /was lost/, shown(r));
        const free = await cli(['inspect', '--url', url, '--key', key]);
        assert.match(free.stdout, /is free/, shown(free));
        const again = await cli(['release', '--url', url, '--key', key, '--force']);
        assert.equal(again.code, 1, shown(again));
        assert.match((await cli(['inspect', '--url', url, '--prefix', prefix])).stdout, /^no held keys/);
      } finally {
        writeFileSync(stop, '');
        await holding.done;
      }
    });
  }

  it("docs/cli.md's inspect and release example runs as written", async () => {
    const readme = readFileSync(join(root, 'docs', 'cli.md'), 'utf8');
    const section = readme.slice(readme.indexOf('\n## Inspecting and releasing by force\n'));
    const block = /\n```sh\n([\s\S]*?)\n```\n/.exec(section)?.[1];
    assert.ok(block?.includes('npx locco-rs inspect') && block.includes('npx locco-rs release'), 'no sh block with inspect and release');
    const ready = join(dir, 'readme-nightly.ready');
    const stop = join(dir, 'readme-nightly.stop');
    const holding = start(['run', '--url', redis.url, '--key', 'nightly-report', '--ttl', '3s', '--holder', 'cron@host-1', '--', node, holder, ready, stop, '30000', '0']);
    try {
      await waitForFile(ready);
      const npx = `npx() { [ "$1" = locco-rs ] || exit 99; shift; "$LOCCO_NODE" "$LOCCO_BIN" "$@"; }\nset -e\n`;
      const r = await new Promise((resolve, reject) => {
        const child = spawn('sh', ['-c', npx + block], {
          env: { ...process.env, REDIS_URL: redis.url, LOCCO_NODE: node, LOCCO_BIN: bin },
          stdio: ['ignore', 'pipe', 'pipe'],
        });
        let out = '';
        child.stdout.on('data', (d) => (out += d));
        child.stderr.on('data', (d) => (out += d));
        child.on('error', reject);
        child.on('close', (code) => resolve({ code, out }));
      });
      assert.equal(r.code, 0, r.out);
      assert.match(r.out, /^nightly-report +\S+ +- +cron@host-1$/m, r.out);
      assert.match(r.out, /^released "nightly-report" held by "cron@host-1"$/m, r.out);
      assert.equal((await holding.done).code, 4);
    } finally {
      writeFileSync(stop, '');
      await holding.done;
    }
  });

  it("run's error for a held key names the holder", async () => {
    const key = newKey('named');
    const ready = join(dir, `${key}.ready`);
    const stop = join(dir, `${key}.stop`);
    const first = start(['run', '--url', redis.url, '--key', key, '--holder', 'first one', '--', node, holder, ready, stop, '30000', '0']);
    try {
      await waitForFile(ready);
      const second = await cli(['run', '--url', redis.url, '--key', key, '--', node, '-e', '']);
      assert.equal(second.code, 3, shown(second));
      assert.match(second.stderr, /is held by "first one"/, shown(second));
    } finally {
      writeFileSync(stop, '');
    }
    assert.equal((await first.done).code, 0);
  });
});
