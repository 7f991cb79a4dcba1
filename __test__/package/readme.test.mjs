// Every code block of README.md and docs/**/*.md runs as written. JavaScript and TypeScript
// blocks are written to files in a temporary project where `locco-rs` resolves to this checkout,
// run with Node (the TypeScript ones through Node's type stripping), and type-checked with
// TypeScript 5.2 and the latest (checkJs for the JavaScript ones). README blocks run alone, as a
// reader who copies one would run it; the blocks of docs/ may call the application's own
// functions (chargeCard and the like), which are stubs here that record their calls. Blocks
// that need a server get one started here, its URL in the variable the block reads. The README's
// quick start also runs on Node 22, and every link of these pages must lead somewhere.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { homedir, tmpdir } from 'node:os';
import { dirname, join, normalize, relative } from 'node:path';
import { after, describe, it } from 'node:test';
import { startEtcd, startMongo, startPostgres, startRedis } from '../support/servers.mjs';

const require = createRequire(import.meta.url);
const root = new URL('../..', import.meta.url).pathname;
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));

/** README.md, then every Markdown file under docs/, as paths relative to the root. */
function pages() {
  const found = [];
  const walk = (dir) => {
    for (const entry of readdirSync(join(root, dir), { withFileTypes: true }).sort((a, b) => a.name.localeCompare(b.name))) {
      const path = `${dir}/${entry.name}`;
      if (entry.isDirectory()) walk(path);
      else if (entry.name.endsWith('.md')) found.push(path);
    }
  };
  walk('docs');
  return ['README.md', ...found];
}

/**
 * A page's headings and fenced blocks, code excluded from the prose. Blocks are
 * { file, lang, code, line, section, id }, id = "<file> § <section> #<n within section>".
 */
function parse(file) {
  const text = readFileSync(join(root, file), 'utf8');
  const lines = text.split('\n');
  const blocks = [];
  const headings = [];
  const prose = [];
  let section = '(top)';
  const perSection = new Map();
  for (let i = 0; i < lines.length; i++) {
    const open = /^```(\w*)\s*$/.exec(lines[i]);
    if (!open) {
      const heading = /^(#{1,6}) (.+)$/.exec(lines[i]);
      if (heading) {
        headings.push({ level: heading[1].length, text: heading[2], line: i + 1 });
        if (heading[1].length <= 3) section = heading[2];
      }
      prose.push({ text: lines[i], line: i + 1 });
      continue;
    }
    const start = i;
    const body = [];
    for (i++; i < lines.length && !/^```\s*$/.test(lines[i]); i++) body.push(lines[i]);
    assert.ok(i < lines.length, `${file}:${start + 1}: a code block is never closed`);
    const n = (perSection.get(section) ?? 0) + 1;
    perSection.set(section, n);
    blocks.push({ file, lang: open[1], code: body.join('\n') + '\n', line: start + 1, section, id: `${file} § ${section} #${n}` });
  }
  return { file, text, blocks, headings, prose };
}

const parsed = pages().map(parse);
const readme = parsed[0];
const blocks = parsed.flatMap((p) => p.blocks);
const runnable = blocks.filter((b) => ['js', 'ts'].includes(b.lang));
const quickStart = 'README.md § Quick start #1';

// What each runnable block needs and what it must have done. A new block fails the test below
// until it is listed here.
const plans = {
  [quickStart]: {
    node22: true,
    stdout: /^order 42 settled\nbuilt: nightly report\nwithLock: nightly report\nmoved 50 from account 1 to account 2$/m,
  },
  'README.md § Quick start #2': { stdout: /^order 42 settled under order:42$/m },
  'README.md § API at a glance #1': {
    stdout: /^app:renderer:permit:[01]\nnull\nwrite fence \d+ state held\nbusy, held by worker-1\n\{ held: true, ttlLeft: \d+, fence: \d+, holder: 'worker-1' \}$/m,
  },
  'docs/guarantees.md § Fencing tokens #1': {
    env: ['DATABASE_URL'],
    async after(servers) {
      const [balance, fence] = servers.postgres.psql('SELECT balance, fence FROM accounts WHERE id = 7').split('|');
      assert.equal(balance, '100');
      assert.ok(Number(fence) >= 1, `fence ${fence}`);
    },
  },
  'docs/api.md § Semaphores and read-write locks #1': { stdout: /rendered under renderer:permit:\d[\s\S]*^null\nwriting with fence \d+$/m },
  'docs/api.md § Who holds a lock #1': {
    stdout: /^busy: report-worker:\d+\ntrue true 1 true\nreport:daily report-worker:\d+\ntrue false$/m,
  },
  'docs/backends/memory.md § In-memory backend #1': {},
  'docs/backends/redis.md § Redis and Valkey #1': { env: ['REDIS_URL'] },
  'docs/backends/redlock.md § Redlock (several independent Redis servers) #1': { stdout: /^servers: 3 function$/m },
  'docs/backends/postgres.md § PostgreSQL #1': { env: ['DATABASE_URL'] },
  'docs/backends/postgres.md § PostgreSQL advisory locks #1': { env: ['DATABASE_URL'] },
  'docs/backends/mongodb.md § MongoDB #1': { env: ['MONGO_URL'] },
  'docs/backends/etcd.md § etcd #1': { env: ['ETCD_ENDPOINTS'] },
  'docs/mutex-manager.md § MutexManager #1': {
    env: ['REDIS_URL'],
    calls: { chargeCard: 1 },
    stdout: /^in this process only: receipt-1$/m,
  },
  'docs/operations.md § Checking a deployment #1': { env: ['REDIS_URL'] },
  'docs/adapters.md § Writing your own adapter #1': {},
  'docs/adapters.md § Writing your own adapter #2': {
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

// Blocks that are not JavaScript or TypeScript: commands and configuration, checked here but
// not run, each with where it is run or why it is not.
const notRun = {
  'README.md § Install #1': 'installs from the npm registry; __test__/package/package.test.mjs installs the packed tarball instead',
  'README.md § Development #1': 'the set-up commands; scripts/test-all.sh is what runs this test',
  'docs/cli.md § Command line #1': 'runs locco-rs against Redis; __test__/package/cli.test.mjs runs this block as written',
  'docs/cli.md § Inspecting and releasing by force #1': 'locco-rs inspect and release against Redis; __test__/package/cli.test.mjs runs this block as written',
  'docs/operations.md § Checking a deployment #2': 'runs locco-rs doctor; __test__/backends/doctor.test.mjs runs it against Redis and PostgreSQL',
  'docs/operations.md § `doctor` in CI #1': 'a CI job step: the same locco-rs doctor command',
  'docs/development.md § Building and testing #1': 'the set-up commands again, where the development notes explain them',
  'docs/api.md § Events #1': 'sample NODE_DEBUG=locco-rs output; __test__/locker/lifecycle.test.mjs checks lines of this shape',
};

const setUp = 'npm install && npm run build && npm run demo\nbash scripts/test-all.sh\n';

describe('README.md is a user page', () => {
  const sections = readme.headings.filter((h) => h.level === 2).map((h) => h.text);

  it('has the two set-up commands, exactly, under ## Development and nowhere above it', () => {
    const dev = readme.blocks.filter((b) => b.section === 'Development');
    assert.deepEqual(dev.map((b) => [b.lang, b.code]), [['sh', setUp]]);
    for (const b of readme.blocks.filter((b) => b.section !== 'Development')) {
      assert.ok(!b.code.includes('scripts/test-all.sh') && !b.code.includes('npm run build'), `${b.id} is a set-up command`);
    }
  });

  it('opens with what it is, then install, quick start, the backends, the API, and ends with development', () => {
    const order = ['Install', 'Quick start', 'Which backend for which guarantee', 'API at a glance', 'Documentation', 'Development', 'License'];
    assert.deepEqual(sections, order);
    const firstSection = readme.text.indexOf('\n## ');
    assert.match(readme.text.slice(0, firstSection), /Distributed locks for Node\.js 22\+/);
    assert.match(readme.text.slice(0, firstSection), /\*\*What a lock promises\.\*\*/);
  });

  it('stays short: at most 300 lines', () => {
    assert.ok(readme.text.split('\n').length <= 300, `${readme.text.split('\n').length} lines`);
  });

  // "The stop before", "a later stop", "stop by stop", "a helper's measurement", "rounds": how the
  // project was made, not what it does. (The verb, "the heartbeat stops", is fine.)
  const madeOf = /\b(this|the|a|each|every|next|later|latest|last|earlier|same) stop('s)?\b|\bstops of\b|\bstop by stop\b|\bhelpers?\b|\brounds?\b(?!\s+trips?)|scale issue/gi;

  it('has no words about how the project was made, here, in docs/ or in bench/RESULTS.md', () => {
    const files = [...parsed, { file: 'bench/RESULTS.md', text: readFileSync(join(root, 'bench/RESULTS.md'), 'utf8') }];
    for (const { file, text } of files) {
      for (const m of text.matchAll(madeOf)) {
        const line = text.slice(0, m.index).split('\n').length;
        assert.fail(`${file}:${line}: "${m[0]}" in: ${text.split('\n')[line - 1]}`);
      }
    }
  });
});

it('every code block is either run here or listed as not run', () => {
  const other = blocks.filter((b) => !['js', 'ts'].includes(b.lang));
  for (const b of other) assert.ok(notRun[b.id], `${b.file}:${b.line} (${b.id}, \`\`\`${b.lang}): not run and not listed`);
  assert.deepEqual(Object.keys(notRun).sort(), other.map((b) => b.id).sort());
  assert.deepEqual(
    runnable.map((b) => b.id).sort(),
    Object.keys(plans).sort(),
    'a runnable block without a plan in readme.test.mjs, or a plan without its block',
  );
  assert.ok(runnable.some((b) => b.lang === 'ts'), 'the pages have a TypeScript block');
  assert.ok(parsed.length > 10, `pages found: ${parsed.map((p) => p.file).join(' ')}`);
});

// GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens; a repeated
// one gets -1, -2, ...
function anchors(page) {
  const seen = new Map();
  const out = new Set();
  for (const h of page.headings) {
    const base = h.text
      .toLowerCase()
      .replace(/[^\p{L}\p{N} _-]/gu, '')
      .replace(/ /g, '-');
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    out.add(n === 0 ? base : `${base}-${n}`);
  }
  return out;
}

// The repository's own web address: links to files the package does not ship go there.
const repoWeb = pkg.homepage.replace(/#.*$/, '');
// What `npm pack` includes besides package.json's "files".
const alwaysPacked = ['package.json', 'README.md', 'LICENSE', 'CHANGELOG.md'];
const packed = (path) => alwaysPacked.includes(path) || pkg.files.some((f) => (f.endsWith('/') ? path.startsWith(f) : path === f));

describe('links', () => {
  const byFile = new Map(parsed.map((p) => [p.file, p]));
  const links = [];
  for (const page of parsed) {
    for (const { text, line } of page.prose) {
      // Inline code is not a link.
      for (const m of text.replace(/`[^`]*`/g, '').matchAll(/\]\(([^)\s]+)\)/g)) links.push({ page, line, target: m[1] });
    }
  }

  it('every relative link points at a file and heading that exist, and that the package ships', () => {
    assert.ok(links.length > 20, `${links.length} links found`);
    for (const { page, line, target } of links) {
      if (/^[a-z]+:/i.test(target)) continue;
      const where = `${page.file}:${line}: ${target}`;
      const [path, anchor] = target.split('#');
      const file = path === '' ? page.file : normalize(join(dirname(page.file), path));
      assert.ok(!relative(root, join(root, file)).startsWith('..'), `${where} leaves the repository`);
      assert.ok(existsSync(join(root, file)), `${where}: no such file`);
      assert.ok(packed(file), `${where}: ${file} is not in the published package; link it as ${repoWeb}/blob/main/${file}`);
      if (anchor !== undefined) {
        const target = byFile.get(file);
        assert.ok(target, `${where}: an anchor into a page that is not checked here`);
        assert.ok(anchors(target).has(anchor), `${where}: no heading #${anchor} in ${file} (${[...anchors(target)].join(', ')})`);
      }
    }
  });

  it("every link into the repository's web address names a file or folder of this checkout", () => {
    const prefix = `${repoWeb}/`;
    let seen = 0;
    for (const { page, line, target } of links) {
      if (!target.startsWith(prefix)) continue;
      seen++;
      const m = /^(?:tree|blob)\/main\/([^#?]+)$/.exec(target.slice(prefix.length));
      assert.ok(m, `${page.file}:${line}: ${target} is not a tree/main or blob/main link`);
      assert.ok(existsSync(join(root, m[1])), `${page.file}:${line}: ${target}: no ${m[1]} here`);
    }
    assert.ok(seen > 0, 'no link into the repository found');
  });
});

// The temporary project: node_modules/locco-rs is this checkout, pg comes from its devDependencies.
const work = mkdtempSync(join(tmpdir(), 'locco-readme-'));
after(() => rmSync(work, { recursive: true, force: true }));
mkdirSync(join(work, 'node_modules', '@types'), { recursive: true });
symlinkSync(root, join(work, 'node_modules', 'locco-rs'));
for (const dep of ['pg', '@types/node']) symlinkSync(join(root, 'node_modules', dep), join(work, 'node_modules', dep));
writeFileSync(join(work, 'package.json'), JSON.stringify({ name: 'readme-blocks', private: true, type: 'module' }));

const fileOf = (b) => `block-${blocks.indexOf(b)}.${b.lang === 'ts' ? 'mts' : 'mjs'}`;
const shown = (b) => `${b.file}:${b.line}`;
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
globalThis.chargeCard = record('chargeCard', (n) => 'receipt-' + n);
process.on('exit', () => writeFileSync(process.env.README_STUB_CALLS, JSON.stringify(calls)));
`,
);
writeFileSync(
  join(work, 'stubs.d.ts'),
  `// The application functions the blocks of docs/ call.
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

for (const name of ['typescript-5.2', 'typescript']) {
  const { version } = require(`${name}/package.json`);
  it(`the blocks type-check with TypeScript ${version} (strict; checkJs for JavaScript)`, () => {
    const r = spawnSync(process.execPath, [require.resolve(`${name}/bin/tsc`), '-p', join(work, 'tsconfig.json')], {
      encoding: 'utf8',
    });
    // Name the page's line, not the temporary file.
    const out = (r.stdout + r.stderr).replace(/[^\s(]*block-(\d+)\.m[jt]s\((\d+),(\d+)\)/g, (_, i, row, col) => {
      const b = blocks[Number(i)];
      return `${b.file}:${b.line + Number(row)}:${col}`;
    });
    assert.equal(r.status, 0, out);
  });
}

function runBlock(b, env, node = process.execPath) {
  const callsFile = join(work, `calls-${blocks.indexOf(b)}.json`);
  const childEnv = { ...process.env, ...env, README_STUB_CALLS: callsFile };
  delete childEnv.NODE_TEST_CONTEXT; // the contract block's node:test reports on its own stdout
  // A README block runs alone, as copied; the blocks of docs/ get the application's stubs.
  const args = b.file === 'README.md' ? [fileOf(b)] : ['--import', './stubs.mjs', fileOf(b)];
  return new Promise((resolve, reject) => {
    const child = spawn(node, args, { cwd: work, env: childEnv });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
    child.on('error', reject);
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      const calls = existsSync(callsFile) ? JSON.parse(readFileSync(callsFile, 'utf8')) : {};
      resolve({ code, signal, stdout, stderr, calls });
    });
  });
}

function checkRun(b, plan, r) {
  const out = `exit ${r.code ?? r.signal}\n--- stdout\n${r.stdout}\n--- stderr\n${r.stderr}`;
  assert.equal(r.code, 0, out);
  assert.doesNotMatch(r.stderr, /Error|Warning/, out);
  assert.deepEqual(r.calls, plan.calls ?? {}, `calls of the application's functions\n${out}`);
  if (plan.stdout) assert.match(r.stdout, plan.stdout, out);
  plan.check?.(r);
}

describe('the blocks run', () => {
  // Each server starts when the first block that needs it runs (so a missing one fails only
  // its blocks), and every server that started is stopped at the end.
  const starters = { REDIS_URL: startRedis, DATABASE_URL: startPostgres, MONGO_URL: startMongo, ETCD_ENDPOINTS: startEtcd };
  const names = { REDIS_URL: 'redis', DATABASE_URL: 'postgres', MONGO_URL: 'mongo', ETCD_ENDPOINTS: 'etcd' };
  const started = {};
  const server = (variable) => (started[variable] ??= starters[variable]());
  after(async () => {
    const all = await Promise.allSettled(Object.values(started));
    await Promise.all(all.map((r) => r.status === 'fulfilled' && r.value.dispose()));
  });

  for (const b of runnable) {
    const plan = plans[b.id] ?? {};
    it(`${shown(b)} (${b.id}, ${b.lang})`, async () => {
      const env = {};
      const servers = {};
      for (const v of plan.env ?? []) {
        const srv = await server(v);
        env[v] = srv.url;
        servers[names[v]] = srv;
      }
      checkRun(b, plan, await runBlock(b, env));
      await plan.after?.(servers);
    });
  }
});

// Node 22, as scripts/test-all.sh installs it.
const cache = join(process.env.XDG_CACHE_HOME ?? join(homedir(), '.cache'), 'locco-rs');
const node22 = join(cache, 'node22', 'node_modules', `node-${process.platform}-${process.arch}`, 'bin', 'node');
const node22Missing = !existsSync(node22) && `no Node 22 at ${node22} (scripts/test-all.sh installs it there)`;

describe('on Node 22', { skip: node22Missing }, () => {
  for (const b of runnable.filter((b) => plans[b.id]?.node22)) {
    it(`${shown(b)} (${b.id}) runs on Node 22 as written`, async () => {
      const version = spawnSync(node22, ['--version'], { encoding: 'utf8' }).stdout.trim();
      assert.match(version, /^v22\./);
      checkRun(b, plans[b.id], await runBlock(b, {}, node22));
    });
  }
});

it('the blocks are extracted as written (a known line of the quick start is in its block)', () => {
  const quick = runnable.find((b) => b.id === quickStart);
  assert.ok(quick.code.includes("const lock = await locker.acquire('order:42', { ttl: 30_000 });"));
  assert.doesNotMatch(quick.code, /^return\b/m, 'a top-level return does not run in a module');
  assert.doesNotMatch(quick.code, /\bawait using\b/, 'the quick start must parse on Node 22');
});
