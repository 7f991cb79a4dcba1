// Every code block of README.md runs as written. JavaScript and TypeScript blocks are written to
// files in a temporary project where `locco-rs` resolves to this checkout, run with Node (the
// TypeScript ones through Node's type stripping), and type-checked with TypeScript 5.2 and the
// latest (checkJs for the JavaScript ones). The application's own functions the blocks call
// (settle, buildReport, transfer, chargeCard) are stubs that record their calls; blocks that
// need a server get one started here, its URL in the variable the block reads.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync, existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { startEtcd, startMongo, startPostgres, startRedis } from './support/servers.mjs';

const require = createRequire(import.meta.url);
const root = new URL('..', import.meta.url).pathname;
const readme = readFileSync(join(root, 'README.md'), 'utf8');

/** The fenced blocks: { lang, code, line, section, id }, id = "<section> #<n within section>". */
function extractBlocks(text) {
  const blocks = [];
  const lines = text.split('\n');
  let section = '(top)';
  const perSection = new Map();
  for (let i = 0; i < lines.length; i++) {
    const heading = /^#{2,3} (.+)$/.exec(lines[i]);
    if (heading) section = heading[1];
    const open = /^```(\w*)\s*$/.exec(lines[i]);
    if (!open) continue;
    const start = i;
    const body = [];
    for (i++; i < lines.length && !/^```\s*$/.test(lines[i]); i++) body.push(lines[i]);
    assert.ok(i < lines.length, `README.md:${start + 1}: a code block is never closed`);
    const n = (perSection.get(section) ?? 0) + 1;
    perSection.set(section, n);
    blocks.push({ lang: open[1], code: body.join('\n') + '\n', line: start + 1, section, id: `${section} #${n}` });
  }
  return blocks;
}

const blocks = extractBlocks(readme);
const runnable = blocks.filter((b) => ['js', 'ts'].includes(b.lang));

// What each runnable block needs and what it must have done. A new block fails the test below
// until it is listed here.
const plans = {
  'Quick start #2': {
    calls: { settle: 1, buildReport: 2, transfer: 1 },
    stdout: /^report: report-2$/m,
  },
  'Fencing tokens #1': {
    env: ['DATABASE_URL'],
    async after(servers) {
      const [balance, fence] = servers.postgres.psql('SELECT balance, fence FROM accounts WHERE id = 7').split('|');
      assert.equal(balance, '100');
      assert.ok(Number(fence) >= 1, `fence ${fence}`);
    },
  },
  'Semaphores and read-write locks #1': { stdout: /rendered under renderer:permit:\d[\s\S]*^null\nwriting with fence \d+$/m },
  'Who holds a lock #1': {
    stdout: /^busy: report-worker:\d+\ntrue true 1 true\nreport:daily report-worker:\d+\ntrue false$/m,
  },
  'In-memory backend #1': {},
  'Redis and Valkey #1': { env: ['REDIS_URL'] },
  'Redlock (several independent Redis servers) #1': { stdout: /^servers: 3 function$/m },
  'PostgreSQL #1': { env: ['DATABASE_URL'] },
  'PostgreSQL advisory locks #1': { env: ['DATABASE_URL'] },
  'MongoDB #1': { env: ['MONGO_URL'] },
  'etcd #1': { env: ['ETCD_ENDPOINTS'] },
  'MutexManager #1': {
    env: ['REDIS_URL'],
    calls: { chargeCard: 1 },
    stdout: /^in this process only: receipt-1$/m,
  },
  'Checking a deployment #1': { env: ['REDIS_URL'] },
  'Write your own adapter #1': {},
  'Write your own adapter #2': {
    // The block imports the user's adapter from ./my-adapter.js: here, a stand-in that keeps
    // its locks in memory, so the contract suite the block registers runs for real.
    files: {
      'my-adapter.js': "import { InMemoryAdapter } from 'locco-rs/memory';\nexport class MyAdapter extends InMemoryAdapter {}\n",
    },
    stdout: /^[#ℹ] fail 0$/m,
    check(r) {
      const pass = Number(/^[#ℹ] pass (\d+)$/m.exec(r.stdout)?.[1]);
      assert.ok(pass >= 5, `the contract suite ran ${pass} tests:\n${r.stdout}`);
    },
  },
};

// Blocks that are not JavaScript or TypeScript: shell commands, checked here but not run.
const shell = {
  '(top) #1': 'the set-up commands; scripts/test-all.sh is what runs this test',
  'Quick start #1': 'installs from the npm registry; __test__/package.test.mjs installs the packed tarball instead',
  'Command line #1': 'runs locco-rs against Redis; __test__/cli.test.mjs runs this block as written',
  'Checking a deployment #2': 'runs locco-rs doctor; __test__/doctor.test.mjs runs it against Redis and PostgreSQL',
  'Inspecting and releasing by force #1': 'locco-rs inspect and release against Redis; __test__/cli.test.mjs runs this block as written',
};

it('README.md starts with exactly the two set-up commands', () => {
  assert.ok(
    readme.startsWith('# locco-rs\n\n```sh\nnpm install && npm run build && npm run demo\nbash scripts/test-all.sh\n```\n'),
    readme.slice(0, 200),
  );
});

it('the README opens with what the library is and a usage example before the development section', () => {
  const at = (s) => readme.indexOf(s);
  assert.ok(at('**What it is.**') > 0 && at('**What it is.**') < at('## Quick start'));
  assert.ok(at("from 'locco-rs'") < at('## Development'));
  assert.ok(at('## Quick start') < at('## What the lock promises'));
});

it('every code block is either run here or a listed shell block', () => {
  const other = blocks.filter((b) => !['js', 'ts'].includes(b.lang));
  for (const b of other) {
    assert.ok(shell[b.id] && b.lang === 'sh', `README.md:${b.line} (${b.id}, \`\`\`${b.lang}): not run and not listed`);
  }
  assert.deepEqual(Object.keys(shell).sort(), other.map((b) => b.id).sort());
  assert.deepEqual(
    runnable.map((b) => b.id).sort(),
    Object.keys(plans).sort(),
    'a runnable block without a plan in readme.test.mjs, or a plan without its block',
  );
  assert.ok(runnable.some((b) => b.lang === 'ts'), 'the README has a TypeScript block');
});

// The temporary project: node_modules/locco-rs is this checkout, pg comes from its devDependencies.
const work = mkdtempSync(join(tmpdir(), 'locco-readme-'));
after(() => rmSync(work, { recursive: true, force: true }));
mkdirSync(join(work, 'node_modules', '@types'), { recursive: true });
symlinkSync(root, join(work, 'node_modules', 'locco-rs'));
for (const dep of ['pg', '@types/node']) symlinkSync(join(root, 'node_modules', dep), join(work, 'node_modules', dep));
writeFileSync(join(work, 'package.json'), JSON.stringify({ name: 'readme-blocks', private: true, type: 'module' }));

const fileOf = (b) => `block-${b.line}.${b.lang === 'ts' ? 'mts' : 'mjs'}`;
for (const b of runnable) {
  writeFileSync(join(work, fileOf(b)), b.code);
  for (const [name, text] of Object.entries(plans[b.id]?.files ?? {})) writeFileSync(join(work, name), text);
}

// The stubs: globals that record their calls and write them out when the process exits.
writeFileSync(
  join(work, 'stubs.mjs'),
  `import { writeFileSync } from 'node:fs';
const calls = {};
const record = (name, value) => (...args) => {
  calls[name] = (calls[name] ?? 0) + 1;
  const signal = args.find((a) => a && a.signal)?.signal;
  if (!(signal instanceof AbortSignal)) throw new Error(name + ' was called without a signal');
  return Promise.resolve(value(calls[name]));
};
globalThis.settle = record('settle', () => undefined);
globalThis.buildReport = record('buildReport', (n) => 'report-' + n);
globalThis.transfer = record('transfer', () => undefined);
globalThis.chargeCard = record('chargeCard', (n) => 'receipt-' + n);
process.on('exit', () => writeFileSync(process.env.README_STUB_CALLS, JSON.stringify(calls)));
`,
);
writeFileSync(
  join(work, 'stubs.d.ts'),
  `// The application functions the README's blocks call.
declare function settle(id: number, options: { signal: AbortSignal }): Promise<void>;
declare function buildReport(options: { signal: AbortSignal }): Promise<string>;
declare function transfer(from: number, to: number, amount: number, options: { signal: AbortSignal }): Promise<void>;
declare function chargeCard(options: { signal: AbortSignal }): Promise<string>;
`,
);
writeFileSync(
  join(work, 'tsconfig.json'),
  JSON.stringify({
    compilerOptions: {
      target: 'ES2022',
      lib: ['ES2022', 'ESNext.Disposable'],
      module: 'NodeNext',
      moduleResolution: 'NodeNext',
      strict: true,
      noImplicitAny: false, // JavaScript blocks carry no annotations
      allowJs: true,
      checkJs: true,
      noEmit: true,
      skipLibCheck: true,
      types: ['node'],
    },
    files: ['stubs.d.ts', ...runnable.map(fileOf)],
  }),
);

for (const pkg of ['typescript-5.2', 'typescript']) {
  const { version } = require(`${pkg}/package.json`);
  it(`the README's blocks type-check with TypeScript ${version} (strict; checkJs for JavaScript)`, () => {
    const r = spawnSync(process.execPath, [require.resolve(`${pkg}/bin/tsc`), '-p', join(work, 'tsconfig.json')], {
      encoding: 'utf8',
    });
    // Name the README line, not the temporary file.
    const out = (r.stdout + r.stderr).replace(/[^\s(]*block-(\d+)\.m[jt]s\((\d+),(\d+)\)/g, (_, l, row, col) => `README.md:${Number(l) + Number(row)}:${col}`);
    assert.equal(r.status, 0, out);
  });
}

function runBlock(b, env) {
  const callsFile = join(work, `calls-${b.line}.json`);
  const childEnv = { ...process.env, ...env, README_STUB_CALLS: callsFile };
  delete childEnv.NODE_TEST_CONTEXT; // the contract block's node:test reports on its own stdout
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', './stubs.mjs', fileOf(b)], { cwd: work, env: childEnv });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
    child.on('error', reject);
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      const calls = existsSync(callsFile) ? JSON.parse(readFileSync(callsFile, 'utf8')) : undefined;
      resolve({ code, signal, stdout, stderr, calls });
    });
  });
}

describe('the README blocks run', () => {
  // Each server starts when the first block that needs it runs (so a missing one fails only
  // its blocks), and every server that started is stopped at the end.
  const starters = { REDIS_URL: startRedis, DATABASE_URL: startPostgres, MONGO_URL: startMongo, ETCD_ENDPOINTS: startEtcd };
  const started = {};
  const server = (variable) => (started[variable] ??= starters[variable]());
  after(async () => {
    const all = await Promise.allSettled(Object.values(started));
    await Promise.all(all.map((r) => r.status === 'fulfilled' && r.value.dispose()));
  });

  for (const b of runnable) {
    const plan = plans[b.id] ?? {};
    it(`README.md:${b.line} (${b.id}, ${b.lang})`, async () => {
      const env = {};
      const servers = {};
      for (const v of plan.env ?? []) {
        const srv = await server(v);
        env[v] = srv.url;
        servers[{ REDIS_URL: 'redis', DATABASE_URL: 'postgres', MONGO_URL: 'mongo', ETCD_ENDPOINTS: 'etcd' }[v]] = srv;
      }
      const r = await runBlock(b, env);
      const shown = `exit ${r.code ?? r.signal}\n--- stdout\n${r.stdout}\n--- stderr\n${r.stderr}`;
      assert.equal(r.code, 0, shown);
      assert.doesNotMatch(r.stderr, /Error|Warning/, shown);
      assert.deepEqual(r.calls, plan.calls ?? {}, `calls of the application's functions\n${shown}`);
      if (plan.stdout) assert.match(r.stdout, plan.stdout, shown);
      plan.check?.(r);
      await plan.after?.(servers);
    });
  }
});

it('the blocks are extracted as written (a known line of the quick start is in its block)', () => {
  const quick = runnable.find((b) => b.id === 'Quick start #2');
  assert.ok(quick.code.includes("await using lock = await locker.acquire(`order:${id}`, { ttl: 30_000 });"));
  assert.doesNotMatch(quick.code, /^return\b/m, 'a top-level return does not run in a module');
});

