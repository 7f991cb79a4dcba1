#!/usr/bin/env node
'use strict';
// The locco-rs command. Each subcommand is one entry of COMMANDS below (its usage text and the
// function that runs it), so a new one is a new entry. The exit codes are shared by all of them.

const { spawn, spawnSync } = require('node:child_process');
const fs = require('node:fs');
const { constants } = require('node:os');
const path = require('node:path');
const { parseArgs } = require('node:util');

const { closest } = require('../lib/options.js');
const { version } = require('../package.json');

/** Exit codes of the tool itself. A command run under the lock exits with its own. */
const EXIT = {
  usage: 2, // a wrong option, argument or URL
  held: 3, // the key is held by someone else (--wait 0), or was not free within --wait
  lost: 4, // the lock was lost while the command ran; the command was stopped
  backend: 5, // the backend failed or could not be reached
  unsafe: 6, // doctor: a finding that can break the locks (a double grant, or no grant at all)
  cannotRun: 126, // the command was found but could not be started
  notFound: 127, // the command was not found
};

const EXIT_CODES_HELP = `Exit codes:
  <n>   the command's own exit code
  128+n the command was killed by signal n (130 for SIGINT, 143 for SIGTERM)
  2     usage error: a wrong option, duration or URL
  3     the key is held: taken by another holder (--wait 0), or not free within --wait
  4     the lock was lost while the command ran: the command was stopped, or it had
        already ended when the final release found the lock gone
  5     the backend failed or could not be reached
  6     doctor: the deployment has an unsafe finding
  126   the command could not be started
  127   the command was not found`;

const FORWARDED_SIGNALS = ['SIGINT', 'SIGTERM', 'SIGHUP'];

/** A mistake on the command line: printed with a pointer to --help, exit code 2. */
class UsageError extends Error {}

/** A failure that ends the tool with `code` after printing `message`. */
class ExitError extends Error {
  constructor(message, code) {
    super(message);
    this.code = code;
  }
}

const UNITS = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };

/**
 * The shortest --ttl. The library takes 1 ms, but a command's lease is renewed every third of
 * it over the network: one slow answer or a paused process loses a shorter one at once.
 */
const MIN_TTL = 1000;

/**
 * Flags a user may try that are not ours: [the flag of ours to use instead, what to say]. The
 * edit distance finds typos, not other words for the same thing.
 */
const NO_CLIENT_CERT = 'client certificates are not supported: --tls-ca sets the CA that verifies the server; put the user and password in the URL';
const FLAG_HINTS = {
  label: ['holder', 'the label stored with the lock is --holder <label>'],
  name: ['holder', 'the label stored with the lock is --holder <label>'],
  'tls-cert': ['tls-ca', NO_CLIENT_CERT],
  'tls-key': ['tls-ca', NO_CLIENT_CERT],
  timeout: ['wait', '--wait sets how long to wait for a held key, --ttl the lease'],
};

/**
 * parseArgs in strict mode, whose errors are usage errors; an unknown flag is named with the
 * closest known one ("did you mean --fencing?"), or with FLAG_HINTS.
 */
function parseFlags(command, args, options, allowPositionals) {
  // Not strict first, to find an unknown flag before anything else can go wrong with it.
  const { tokens } = parseArgs({ args, options, allowPositionals: true, strict: false, tokens: true });
  for (const t of tokens) {
    if (t.kind === 'option-terminator') break;
    if (t.kind !== 'option' || Object.hasOwn(options, t.name)) continue;
    const guess = t.rawName.startsWith('--') ? closest(t.name, Object.keys(options)) : undefined;
    const [instead, said] = FLAG_HINTS[t.name] ?? [];
    let hint = guess === undefined ? `locco-rs ${command} --help lists the options` : `did you mean --${guess}?`;
    if (instead !== undefined && Object.hasOwn(options, instead)) hint = said;
    throw new UsageError(`unknown option ${t.rawName} for locco-rs ${command}: ${hint}`);
  }
  try {
    return parseArgs({ args, options, allowPositionals, strict: true, tokens: true });
  } catch (error) {
    throw new UsageError(error.message);
  }
}

/** '500ms', '30s', '1.5m', '1h' or a plain number of milliseconds, as whole milliseconds. */
function parseDuration(option, text) {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(text);
  const ms = m === null ? NaN : Number(m[1]) * UNITS[m[2] ?? 'ms'];
  if (!Number.isSafeInteger(ms)) {
    throw new UsageError(
      `--${option} ${JSON.stringify(text)} is not a duration: use a whole number of milliseconds, or a number with ms, s, m or h (500ms, 30s, 5m, 1h)`,
    );
  }
  return ms;
}

/** `user:password@` of a URL, percent-decoded; undefined when the URL has none. */
function userInfo(text) {
  if (text === undefined) return undefined;
  const at = text.indexOf(':');
  const decode = (s) => decodeURIComponent(s);
  return at < 0 ? { username: decode(text), password: '' } : { username: decode(text.slice(0, at)), password: decode(text.slice(at + 1)) };
}

/**
 * etcd://[user:password@]host[:port][,host[:port]…] as EtcdAdapter options. A host without a
 * port gets etcd's client port, 2379.
 */
function etcdOptions(url) {
  const m = /^etcd:\/\/(?:([^@/?#]*)@)?([^/?#]*)\/?$/i.exec(url);
  if (m === null) throw new UsageError('an etcd URL is etcd://[user:password@]host:port[,host:port…], with no path or query');
  const endpoints = m[2].split(',').map((h) => (/:\d+$/.test(h) || h === '' ? h : `${h}:2379`));
  if (endpoints.some((h) => h === '')) throw new UsageError('the etcd URL names no host (etcd://host:port)');
  const auth = userInfo(m[1]);
  return auth === undefined ? { endpoints } : { endpoints, auth };
}

/** A file's text for a flag that names one: a usage error naming the flag when it cannot be read. */
function readFlagFile(flag, file) {
  try {
    return fs.readFileSync(file, 'utf8');
  } catch (error) {
    throw new UsageError(`--${flag} ${JSON.stringify(file)} cannot be read: ${error.code ?? error.message}`);
  }
}

/** The backends by URL scheme. */
const SCHEMES = {
  redis: 'redis',
  rediss: 'redis',
  postgres: 'postgres',
  postgresql: 'postgres',
  mongodb: 'mongo',
  'mongodb+srv': 'mongo',
  etcd: 'etcd',
};

/** The adapter of each kind of backend, from its URLs and the options the flags set. */
const ADAPTERS = {
  redis: (urls, o) => new (require('../entry/redis.js').RedisAdapter)({ url: urls[0], ...o }),
  cluster: (urls, o) => new (require('../entry/redis.js').RedisAdapter)({ urls, cluster: true, ...o }),
  redlock: (urls, o) => new (require('../entry/redis.js').RedlockAdapter)({ urls, ...o }),
  postgres: (urls, o) => new (require('../entry/postgres.js').PostgresAdapter)({ url: urls[0], ...o }),
  mongo: (urls, o) => new (require('../entry/mongo.js').MongoAdapter)({ url: urls[0], ...o }),
  etcd: (urls, o) => new (require('../entry/etcd.js').EtcdAdapter)({ ...etcdOptions(urls[0]), ...o }),
};

const REDIS_KINDS = ['redis', 'cluster', 'redlock'];

/**
 * The flags that choose and set up the backend, the same for every command: inspect, release
 * and doctor must reach the servers, table or prefix that the holders use. `kinds`: the kinds of
 * ADAPTERS a flag applies to; `fields`: the adapter options it sets (to name the flag in the
 * adapter's errors); `set`: puts its value into the adapter's options.
 */
const BACKEND_FLAGS = {
  'tls-ca': {
    kinds: [...REDIS_KINDS, 'postgres', 'etcd'],
    elsewhere: { mongo: 'MongoDB takes its CA in the URL: ?tls=true&tlsCAFile=<file>' },
    fields: ['tls'],
    set: (o, v) => (o.tls = { ca: readFlagFile('tls-ca', v) }),
  },
  'connect-timeout': {
    kinds: Object.keys(ADAPTERS),
    fields: ['connectTimeout'],
    set: (o, v) => (o.connectTimeout = parseDuration('connect-timeout', v)),
  },
  'command-timeout': {
    kinds: [...REDIS_KINDS, 'etcd'],
    fields: ['commandTimeout', 'requestTimeout'],
    set: (o, v, kind) => (o[kind === 'etcd' ? 'requestTimeout' : 'commandTimeout'] = parseDuration('command-timeout', v)),
  },
  'server-timeout': { kinds: ['redlock'], fields: ['serverTimeout'], set: (o, v) => (o.serverTimeout = parseDuration('server-timeout', v)) },
  'pg-mode': { kinds: ['postgres'], fields: ['mode'], set: (o, v) => (o.mode = v) },
  'pg-keys': { kinds: ['postgres'], fields: ['keys'], set: (o, v) => (o.keys = v) },
  'pg-table': { kinds: ['postgres'], fields: ['tableName'], set: (o, v) => (o.tableName = v) },
  'mongo-db': { kinds: ['mongo'], fields: ['dbName'], set: (o, v) => (o.dbName = v) },
  'mongo-collection': { kinds: ['mongo'], fields: ['collectionName'], set: (o, v) => (o.collectionName = v) },
  'etcd-prefix': { kinds: ['etcd'], fields: ['prefix'], set: (o, v) => (o.prefix = v) },
};

/** parseArgs's declaration of the backend flags, for each command's options. */
const BACKEND_OPTIONS = {
  url: { type: 'string', multiple: true },
  redlock: { type: 'boolean', default: false },
  cluster: { type: 'boolean', default: false },
  ...Object.fromEntries(Object.keys(BACKEND_FLAGS).map((flag) => [flag, { type: 'string' }])),
};

const BACKEND_HELP = `Backend options (the same for every command, so that inspect and release see
what run holds):
  --url <url>         the backend (or set LOCCO_URL, which keeps a password out of the
                      process list): redis://, rediss://, postgres://, postgresql://,
                      mongodb://, mongodb+srv://, or etcd://host:port[,host:port…].
                      Give it once per server with --redlock or --cluster (LOCCO_URL:
                      the URLs separated by spaces)
  --redlock           Redlock: three or more independent Redis servers, one --url each;
                      a lock is granted when a majority grants it (no fencing tokens)
  --cluster           one Redis Cluster: each --url is a seed node
                      Several redis URLs need one of the two: they make different locks
                      (a majority of separate servers, or one server per key), so say which
  --tls-ca <file>     PEM certificate(s) to trust: rediss://, PostgreSQL with
                      ?sslmode=verify-full, etcd over TLS (MongoDB: tlsCAFile in the URL).
                      Client certificates are not supported
  --connect-timeout <duration>
                      time to establish a connection (default 5s)
  --command-timeout <duration>
                      Redis and Redlock: time to wait for one answer; etcd: for one
                      request (default 5s)
  --server-timeout <duration>
                      Redlock: time to wait for any one server (default 250ms)
  --pg-mode <table|advisory>
                      PostgreSQL: rows of a lock table (default), or session advisory
                      locks (pg_try_advisory_lock), the mode the application uses
  --pg-keys <hash|integer>
                      PostgreSQL advisory mode: a key is hashed (default), or is the
                      64-bit number itself, as pg_advisory_lock(12345) takes it
  --pg-table <name>   PostgreSQL: the lock table (default locco_locks); advisory mode
                      hashes keys under this name
  --mongo-db <name>   MongoDB: the database (default: the URL's, else locco)
  --mongo-collection <name>
                      MongoDB: the lock collection (default locco-locks)
  --etcd-prefix <prefix>
                      etcd: put before every key (default locco/)`;

const KIND_NAMES = {
  redis: 'a redis:// URL',
  cluster: '--cluster',
  redlock: '--redlock',
  postgres: 'a postgres:// URL',
  mongo: 'a mongodb:// URL',
  etcd: 'an etcd:// URL',
};

/** The backend's URLs: the --url flags, else LOCCO_URL's space-separated URLs. */
function backendUrls(values, command) {
  const urls = values.url ?? (process.env.LOCCO_URL ?? '').split(/\s+/).filter((u) => u !== '');
  if (urls.length === 0 || urls.includes('')) {
    throw new UsageError(`--url is required (or set LOCCO_URL): locco-rs ${command} --url <backend-url> …`);
  }
  return urls;
}

/** Which of ADAPTERS the URLs and --redlock / --cluster ask for. */
function backendKind(urls, values) {
  const schemes = urls.map((url) => /^([a-zA-Z][a-zA-Z0-9+.-]*):\/\//.exec(url)?.[1].toLowerCase());
  const unknown = schemes.findIndex((s) => s === undefined || !Object.hasOwn(SCHEMES, s));
  if (unknown >= 0) {
    const known = Object.keys(SCHEMES).map((s) => `${s}://`).join(', ');
    throw new UsageError(`--url must start with one of ${known}${schemes[unknown] ? `; ${schemes[unknown]}:// is not one` : ''}`);
  }
  const backends = new Set(schemes.map((s) => SCHEMES[s]));
  if (backends.size > 1) throw new UsageError(`the --url flags name different backends (${[...backends].join(', ')}): give the servers of one`);
  const [backend] = backends;
  if (backend !== 'redis') {
    const redisFlag = ['redlock', 'cluster'].find((f) => values[f]);
    if (redisFlag) throw new UsageError(`--${redisFlag} applies to redis:// URLs, not ${schemes[0]}://`);
    if (urls.length > 1) throw new UsageError(`give one --url for ${schemes[0]}://; list several hosts inside it (host1:port,host2:port)`);
    return backend;
  }
  if (values.redlock && values.cluster) throw new UsageError('give --redlock or --cluster, not both');
  if (values.redlock) return 'redlock';
  if (values.cluster) return 'cluster';
  if (urls.length > 1) {
    throw new UsageError(
      `${urls.length} redis URLs: add --redlock (independent servers, a majority grants a lock) or --cluster (seed nodes of one Redis Cluster)`,
    );
  }
  return 'redis';
}

/** The flag that sets the adapter option `field` ('tls.ca', 'urls[1]'), for an error's message. */
function flagOf(field) {
  const root = String(field ?? '').split(/[.[]/)[0];
  const entry = Object.entries(BACKEND_FLAGS).find(([, f]) => f.fields.includes(root));
  return entry === undefined ? '--url' : `--${entry[0]}`;
}

/** The adapter that the backend flags of `values` name; usage errors before any connection. */
function createAdapter(values) {
  const urls = backendUrls(values, 'run');
  const kind = backendKind(urls, values);
  const options = {};
  for (const [flag, { kinds, elsewhere, set }] of Object.entries(BACKEND_FLAGS)) {
    if (values[flag] === undefined) continue;
    if (!kinds.includes(kind)) {
      const note = elsewhere?.[kind] === undefined ? '' : ` (${elsewhere[kind]})`;
      throw new UsageError(`--${flag} applies to ${kinds.map((k) => KIND_NAMES[k]).join(', ')}; not to ${KIND_NAMES[kind]}${note}`);
    }
    set(options, values[flag], kind);
  }
  try {
    return ADAPTERS[kind](urls, options);
  } catch (error) {
    // The adapters' messages name the option at fault and never repeat a password.
    if (error && error.code === 'LOCK_VALIDATION') throw new UsageError(`${flagOf(error.field)}: ${error.message}`);
    throw error;
  }
}

/** 128 + the signal's number, as a shell reports a command killed by a signal. */
function signalExitCode(signal) {
  return 128 + (constants.signals[signal] ?? 0);
}

function say(message) {
  process.stderr.write(`locco-rs: ${message}\n`);
}

const RUN_USAGE = `Usage: locco-rs run --url <backend-url> --key <key> [options] -- <command> [args…]

Takes the lock <key>, runs the command while holding it (the lease is extended in the
background), and releases the lock when the command exits.

Options:
  --key <key>         the lock's key
  --ttl <duration>    lease length, extended every third of it while the command runs
                      (default 30s; at least 1s)
  --wait <duration>   how long to wait for a held key; 0 makes one attempt (default 0).
                      While it waits, it says every 5s on stderr whom it waits for
  --fencing           take a fencing token and pass it to the command as LOCCO_FENCE
  --grace <duration>  when the lock is lost, time between SIGTERM and SIGKILL (default 5s)
  --max-hold <duration>
                      the longest the lock is held; then it counts as lost and the command
                      is stopped (default: no limit)
  --holder <label>    stored with the lock, shown by locco-rs inspect and in a rival's
                      "held by" message (default: <hostname>:<pid>)
  -h, --help          this text

${BACKEND_HELP}

Durations: 500ms, 30s, 1.5m, 1h, or a plain number of milliseconds.

SIGINT, SIGTERM and SIGHUP are passed on to the command, which decides when to exit; a
second SIGINT (Ctrl-C twice) kills it with SIGKILL. A signal that arrives once the command
has ended does not cut the release of the lock short.

If the lock is lost while the command runs, the command gets SIGTERM, then SIGKILL after
--grace, and locco-rs exits with 4 whatever the command's own exit code. A loss that only
the final release finds (the lock was released by force, expired or evicted, and the
command ended before the next extension noticed) also exits 4.

If locco-rs itself is killed (SIGKILL, the OOM killer, a container stop): on Linux, where
setpriv (util-linux) is installed, the command is started with a parent-death signal and is
killed with it; processes the command started itself are not, unless it stops them. On other
systems, or without setpriv, the command keeps running without the lock until it ends: stop
the whole process group (kill -- -<pgid>) or the container, not locco-rs alone.

${EXIT_CODES_HELP}

Example:
  locco-rs run --url redis://127.0.0.1:6379 --key nightly-report --ttl 30s -- node report.js`;

const RUN_OPTIONS = {
  ...BACKEND_OPTIONS,
  key: { type: 'string' },
  ttl: { type: 'string', default: '30s' },
  wait: { type: 'string', default: '0' },
  fencing: { type: 'boolean', default: false },
  grace: { type: 'string', default: '5s' },
  'max-hold': { type: 'string' },
  holder: { type: 'string' },
  help: { type: 'boolean', short: 'h', default: false },
};

/** Splits `run`'s arguments into checked settings and the command after `--`. */
function parseRun(args) {
  const { values, tokens } = parseFlags('run', args, RUN_OPTIONS, true);
  if (values.help) return { help: true };
  const terminator = tokens.find((t) => t.kind === 'option-terminator');
  const early = tokens.find((t) => t.kind === 'positional' && (terminator === undefined || t.index < terminator.index));
  if (early !== undefined) {
    throw new UsageError(`unexpected argument ${JSON.stringify(early.value)}: put the command after --`);
  }
  const command = terminator === undefined ? [] : args.slice(terminator.index + 1);
  if (command.length === 0) throw new UsageError('no command: put it after --, as in locco-rs run --url … --key … -- <command>');
  if (command[0] === '') throw new UsageError('the command after -- is an empty string');
  backendUrls(values, 'run');
  if (values.key === undefined || values.key === '') throw new UsageError('--key is required');
  const ttl = parseDuration('ttl', values.ttl);
  if (ttl < MIN_TTL) {
    throw new UsageError(
      `--ttl must be at least ${formatDuration(MIN_TTL)}, got ${formatDuration(ttl)}: the lease is extended every third of it, and a shorter one is lost to one slow answer or a pause of this process`,
    );
  }
  const maxHold = values['max-hold'] === undefined ? Number.MAX_SAFE_INTEGER : parseDuration('max-hold', values['max-hold']);
  if (maxHold < 1) throw new UsageError('--max-hold must be at least 1ms');
  return {
    backend: values,
    key: values.key,
    ttl,
    wait: parseDuration('wait', values.wait),
    grace: parseDuration('grace', values.grace),
    maxHold,
    fencing: values.fencing,
    holder: values.holder ?? `${require('node:os').hostname()}:${process.pid}`,
    command,
  };
}

/** Takes the lock: one attempt for wait 0, else retries until `wait` runs out or `stop` aborts. */
async function takeLock(locker, settings, stop) {
  const { key, ttl, wait, maxHold, holder } = settings;
  const autoExtend = { maxHold };
  let lock;
  try {
    if (wait === 0) {
      // One attempt, but retries: 0 rather than tryAcquire, so that a held key's error names its holder.
      lock = await locker.acquire(key, { ttl, autoExtend, holder, signal: stop, retry: { retries: 0 } });
    } else {
      const { exponentialBackoff } = require('../index.js');
      const delay = exponentialBackoff({ base: 50, max: 1000 });
      const waiting = locker.acquire(key, { ttl, autoExtend, holder, signal: stop, retry: { retries: Infinity, delay, timeout: wait } });
      lock = await reportWhileWaiting(locker, key, wait, waiting);
    }
  } catch (error) {
    if (stop.aborted && error === stop.reason) throw error;
    throw asExit(error, key);
  }
  if (lock === null) throw new ExitError(`the lock ${JSON.stringify(key)} is held by another holder`, EXIT.held);
  return lock;
}

/** How often a waiting run says on stderr whom it waits for. */
const WAIT_REPORT_MS = 5000;

/**
 * Resolves as `waiting` does; meanwhile, every few seconds, says on stderr whom the run waits
 * for (the holder's label and its lease's time left, when the backend can tell) and how long.
 */
async function reportWhileWaiting(locker, key, wait, waiting) {
  const started = Date.now();
  const report = async () => {
    let who = '';
    try {
      const info = await locker.inspect(key);
      if (info.held) who = `: held by ${info.holder === undefined ? 'another holder' : JSON.stringify(info.holder)}${info.ttlLeft === undefined ? '' : `, ${formatDuration(info.ttlLeft)} left on its lease`}`;
    } catch {
      // Who holds it stays unsaid; the wait goes on.
    }
    process.stderr.write(`locco-rs: waiting for ${JSON.stringify(key)}${who} (waited ${formatDuration(Date.now() - started)} of ${formatDuration(wait)})\n`);
  };
  const timer = setInterval(() => void report(), WAIT_REPORT_MS);
  try {
    return await waiting;
  } finally {
    clearInterval(timer);
  }
}

/** A library error as the exit code it maps to. */
function asExit(error, key) {
  const code = error && error.code;
  if (code === 'LOCK_HELD') {
    const by = error.holder === undefined ? 'another holder' : JSON.stringify(error.holder);
    const detail = error.reason === 'held' ? `is held by ${by}` : 'was granted too late and given back';
    const within = error.attempts > 1 ? ` (${error.attempts} attempts in ${Math.round(error.elapsedMs)} ms)` : '';
    return new ExitError(`the lock ${JSON.stringify(key)} ${detail}${within}`, EXIT.held);
  }
  if (code === 'LOCK_VALIDATION') return new UsageError(error.message);
  return new ExitError(`backend error: ${error && error.message ? error.message : String(error)}`, EXIT.backend);
}

/**
 * setpriv from util-linux when it can give the command a parent-death signal (Linux only), so
 * that the command dies with locco-rs even when locco-rs is killed with SIGKILL.
 *
 * PR_SET_PDEATHSIG fires when the *thread* that forked the child ends, not the process; Node
 * forks in uv_spawn on the main JavaScript thread, which ends only with the process.
 */
function setpriv() {
  if (process.platform !== 'linux') return undefined;
  for (const file of ['/usr/bin/setpriv', '/bin/setpriv', '/usr/sbin/setpriv', '/sbin/setpriv']) {
    if (!fs.existsSync(file)) continue;
    // --pdeathsig is in setpriv since util-linux 2.33.
    const help = spawnSync(file, ['--help'], { encoding: 'utf8', timeout: 5000 });
    if (typeof help.stdout === 'string' && help.stdout.includes('--pdeathsig')) return file;
  }
  return undefined;
}

/**
 * Whether exec would refuse `file` with `env`'s PATH (not found, or not an executable file).
 * Such a command is started directly, so that spawn reports why: through setpriv its failure
 * would only be an exit code.
 */
function cannotExec(file, env) {
  const candidates = file.includes('/') ? [file] : (env.PATH ?? '').split(path.delimiter).map((dir) => path.join(dir || '.', file));
  return !candidates.some((candidate) => {
    try {
      fs.accessSync(candidate, fs.constants.X_OK);
      return fs.statSync(candidate).isFile();
    } catch {
      return false;
    }
  });
}

/** Starts the command, tied to locco-rs's life where the system allows it (see setpriv). */
function spawnCommand(file, args, options) {
  const tie = setpriv();
  if (tie === undefined || cannotExec(file, options.env)) return spawn(file, args, options);
  // setpriv execs the command: same pid, so signals sent to the child reach the command.
  return spawn(tie, ['--pdeathsig', 'KILL', '--', file, ...args], options);
}

/**
 * Runs the command as a child with inherited stdio; settles with { code, lost, started }: the
 * command's exit code (or EXIT.lost when a loss stopped it), whether a loss was seen while it
 * ran, and whether it ran at all. A lost lock stops it. `session.child` is set while it runs,
 * for the signal handler of `run`.
 */
function runChild(settings, lock, session) {
  const [file, ...args] = settings.command;
  const env = { ...process.env };
  if (settings.fencing) env.LOCCO_FENCE = String(lock.fence);
  return new Promise((resolve) => {
    let lostReason;
    let killTimer;
    const child = spawnCommand(file, args, { stdio: 'inherit', env });
    session.child = child;
    const onLost = () => {
      lostReason = lock.lostReason ?? 'lost';
      say(`the lock ${JSON.stringify(lock.key)} was lost (${lostReason}); stopping the command (SIGTERM, SIGKILL after ${settings.grace} ms)`);
      child.kill('SIGTERM');
      killTimer = setTimeout(() => child.kill('SIGKILL'), settings.grace);
    };
    const { signal } = lock;
    if (signal.aborted) queueMicrotask(onLost);
    else signal.addEventListener('abort', onLost, { once: true });
    const done = (code, started) => {
      session.child = undefined;
      signal.removeEventListener('abort', onLost);
      clearTimeout(killTimer);
      resolve({ code, lost: lostReason !== undefined, started });
    };
    child.once('error', (error) => {
      // The command could not be started ('exit' does not follow).
      say(`cannot run ${JSON.stringify(file)}: ${error.message}`);
      done(error.code === 'ENOENT' ? EXIT.notFound : EXIT.cannotRun, false);
    });
    child.once('exit', (code, sig) => {
      if (lostReason !== undefined) done(EXIT.lost, true);
      else done(code ?? signalExitCode(sig), true);
    });
  });
}

/**
 * The one handler of SIGINT, SIGTERM and SIGHUP for a whole run. Waiting for the key, a signal
 * ends the wait (`stop`). While the command runs it is passed on: in a terminal Ctrl-C reaches
 * the command directly too (one process group), but a signal sent to locco-rs alone (kill, a
 * supervisor) needs it; a second SIGINT kills the command, as most runners do. Once the
 * command has ended a signal changes nothing: the lock's release runs to its end (Node's
 * default, dying at once, would leave the lock held until its lease runs out).
 */
function signalHandler(session, stop) {
  return (signal) => {
    const { child } = session;
    if (child === undefined) {
      if (session.waiting) stop.abort(signal);
      return;
    }
    if (signal === 'SIGINT' && ++session.interrupts >= 2) {
      say('interrupted twice: killing the command (SIGKILL)');
      child.kill('SIGKILL');
      return;
    }
    child.kill(signal);
  };
}

async function run(args) {
  const settings = parseRun(args);
  if (settings.help) {
    process.stdout.write(`${RUN_USAGE}\n`);
    return 0;
  }
  const adapter = createAdapter(settings.backend);
  const { Locker } = require('../index.js');
  const locker = new Locker({ adapter, fencing: settings.fencing });
  // A signal while waiting for the key ends the wait, as it would have ended the command.
  const stop = new AbortController();
  const session = { waiting: true, child: undefined, interrupts: 0 };
  const onSignal = signalHandler(session, stop);
  for (const s of FORWARDED_SIGNALS) process.on(s, onSignal);
  try {
    let lock;
    try {
      lock = await takeLock(locker, settings, stop.signal);
    } catch (error) {
      if (stop.signal.aborted && error === stop.signal.reason) return signalExitCode(stop.signal.reason);
      throw error;
    }
    if (stop.signal.aborted) {
      // A signal came during a single attempt that then succeeded: do not start the command.
      session.waiting = false;
      await lock.release().catch(() => {});
      return signalExitCode(stop.signal.reason);
    }
    session.waiting = false;
    const { code, lost, started } = await runChild(settings, lock, session);
    let released;
    try {
      // After a loss this deletes nothing (the key is gone or another holder's) and answers false.
      released = await lock.release();
    } catch (error) {
      // The command's outcome stands; the lease ends on its own at its ttl.
      say(`the lock ${JSON.stringify(settings.key)} could not be released (${error.message}); it expires by itself`);
      return code;
    }
    if (!released && started && !lost) {
      // Taken away while the command ran (a forced release, an eviction, a server restart
      // without persistence), and the command ended before an extension could notice.
      say(`the lock ${JSON.stringify(settings.key)} was lost while the command ran: at the release it was no longer held (released by force, expired or evicted)`);
      return EXIT.lost;
    }
    return code;
  } finally {
    await locker.close().catch(() => {});
    await adapter.close().catch(() => {});
    for (const s of FORWARDED_SIGNALS) process.off(s, onSignal);
  }
}

const DOCTOR_USAGE = `Usage: locco-rs doctor --url <backend-url> [--json] [--clock-sample <duration>]

Checks the deployment behind <backend-url> against what the locks rely on (eviction and
persistence on Redis, the lock table's key and rights on PostgreSQL, write concern and
indexes on MongoDB, the cluster on etcd, and the holder's clock rate against the server's)
and prints each finding with why it matters and how to fix it. Writes nothing.

Options:
  --json                   print { findings, counts } as JSON instead of text
  --clock-sample <duration>
                           how long to compare this machine's clock with the server's
                           (default 3s; 0 skips the clock check)
  -h, --help               this text

${BACKEND_HELP}

Exit codes: 0 no unsafe finding (warnings and info allowed), 6 an unsafe finding,
5 the backend failed or could not be reached, 2 a usage error.

Example:
  locco-rs doctor --url redis://127.0.0.1:6379`;

const DOCTOR_OPTIONS = {
  ...BACKEND_OPTIONS,
  json: { type: 'boolean', default: false },
  'clock-sample': { type: 'string', default: '3s' },
  help: { type: 'boolean', short: 'h', default: false },
};

async function doctor(args) {
  const { values } = parseFlags('doctor', args, DOCTOR_OPTIONS, false);
  if (values.help) {
    process.stdout.write(`${DOCTOR_USAGE}\n`);
    return 0;
  }
  backendUrls(values, 'doctor');
  const clockSampleMs = parseDuration('clock-sample', values['clock-sample']);
  const adapter = createAdapter(values);
  const { countFindings, formatFindings } = require('../lib/doctor.js');
  try {
    const findings = await adapter.checkSafety({ clockSampleMs });
    const counts = countFindings(findings);
    if (values.json) process.stdout.write(`${JSON.stringify({ findings, counts }, null, 2)}\n`);
    else process.stdout.write(`${formatFindings(findings)}\n`);
    return counts.unsafe > 0 ? EXIT.unsafe : 0;
  } catch (error) {
    throw asExit(error, undefined);
  } finally {
    await adapter.close().catch(() => {});
  }
}

// ---- inspect and release: operator commands over the held keys ----

const INSPECT_USAGE = `Usage: locco-rs inspect --url <backend-url> [--key <key> | --prefix <prefix>] [options]

Shows the held locks: each key with the time its lease has left, its last fencing token
(when the backend keeps one per key) and its holder's label (the holder option, or
locco-rs run's --holder). Never a lock's token.

Options:
  --key <key>         show this key only, held or free
  --prefix <prefix>   show the held keys that start with <prefix> (default: all)
  --limit <n>         show at most <n> keys (default 100)
  --permits <n>       with --key: the key is a semaphore of <n> permits; show how many are
                      held and each holder
  --read-write        with --key: the key is a read-write lock; show its writer and readers
  --max-readers <n>   with --read-write: its maxReaders, if the lock was taken with one
                      (default 32)
  --json              print JSON: an array of { key, held, ttlLeft?, fence?, holder? }
                      (ttlLeft in ms), or one such object with --key; with --permits
                      { limit, held, holders }, with --read-write { maxReaders, writer, readers }
  -h, --help          this text

${BACKEND_HELP}

Times left are shown as durations (850ms, 12.5s, 3m); "-" when the backend cannot tell
(etcd knows a lease's time left only in the process that holds it).

Exit codes:
  0     shown (also when no key is held)
  2     usage error: a wrong option or URL
  5     the backend failed, could not be reached, or cannot list or inspect keys

Example:
  locco-rs inspect --url redis://127.0.0.1:6379 --prefix jobs:`;

const INSPECT_OPTIONS = {
  ...BACKEND_OPTIONS,
  key: { type: 'string' },
  prefix: { type: 'string', default: '' },
  limit: { type: 'string', default: '100' },
  permits: { type: 'string' },
  'read-write': { type: 'boolean', default: false },
  'max-readers': { type: 'string' },
  json: { type: 'boolean', default: false },
  help: { type: 'boolean', short: 'h', default: false },
};

const RELEASE_USAGE = `Usage: locco-rs release --url <backend-url> --key <key> --force

Releases a lock by force: deletes whatever lease holds <key>, whoever holds it. An operator's
tool for a holder that is stuck or gone, and a dangerous one: the holder is not told. It
learns that the lock is lost only at its next extension (a locco-rs run then stops its
command), and until then it may still be writing. Only fencing tokens, checked by the
resource, keep the late writes of a holder that lost its lock out.

Without --force nothing is released: locco-rs says what it would remove and exits with 2.

Options:
  --key <key>         the lock's key
  --force             really release it
  -h, --help          this text

${BACKEND_HELP}

Exit codes:
  0     released: a live lease was removed
  1     nothing to release: no lease held the key
  2     usage error, or --force is missing (nothing was released)
  5     the backend failed, could not be reached, or cannot release by force

Example:
  locco-rs release --url redis://127.0.0.1:6379 --key nightly-report --force`;

const RELEASE_OPTIONS = {
  ...BACKEND_OPTIONS,
  key: { type: 'string' },
  force: { type: 'boolean', default: false },
  help: { type: 'boolean', short: 'h', default: false },
};

/** Options without positionals; `--url` (or LOCCO_URL) required. */
function parseOperator(args, options, command) {
  const { values } = parseFlags(command, args, options, false);
  if (values.help) return values;
  backendUrls(values, command);
  if (values.key === '') throw new UsageError('--key must not be empty');
  return values;
}

/** Milliseconds as the shortest duration run's options accept back (850ms, 12.5s, 3m). */
function formatDuration(ms) {
  if (ms === undefined) return '-';
  if (ms < 1000) return `${Math.round(ms)}ms`;
  for (const [unit, size] of [['h', UNITS.h], ['m', UNITS.m], ['s', UNITS.s]]) {
    if (ms >= size) return `${Number((ms / size).toFixed(1))}${unit}`;
  }
  return `${ms}ms`;
}

/** Runs `work(locker)` over a Locker on `url`, closing both afterwards. */
async function withLocker(values, work) {
  const adapter = createAdapter(values);
  const { Locker } = require('../index.js');
  const locker = new Locker({ adapter });
  try {
    return await work(locker);
  } catch (error) {
    throw asExit(error, undefined);
  } finally {
    await locker.close().catch(() => {});
    await adapter.close().catch(() => {});
  }
}

function table(rows) {
  const head = ['KEY', 'TTL LEFT', 'FENCE', 'HOLDER'];
  const cells = rows.map((r) => [r.key, formatDuration(r.ttlLeft), r.fence === undefined ? '-' : String(r.fence), r.holder ?? '-']);
  const width = head.map((h, i) => Math.max(h.length, ...cells.map((c) => c[i].length)));
  return [head, ...cells].map((c) => c.map((v, i) => (i === c.length - 1 ? v : v.padEnd(width[i]))).join('  ')).join('\n');
}

async function inspectCommand(args) {
  const o = parseOperator(args, INSPECT_OPTIONS, 'inspect');
  if (o.help) {
    process.stdout.write(`${INSPECT_USAGE}\n`);
    return 0;
  }
  // A count flag's value, or undefined when it is not given.
  const count = (flag) => {
    const v = o[flag];
    if (v === undefined) return undefined;
    if (!/^[1-9]\d*$/.test(v)) throw new UsageError(`--${flag} ${JSON.stringify(v)} is not a whole number >= 1`);
    return Number(v);
  };
  const limit = count('limit');
  if (o.key !== undefined && o.prefix !== '') throw new UsageError('give --key or --prefix, not both');
  const permits = count('permits');
  const maxReaders = count('max-readers');
  const rw = o['read-write'];
  if ((permits !== undefined || rw) && o.key === undefined) throw new UsageError(`--${rw ? 'read-write' : 'permits'} needs --key`);
  if (permits !== undefined && rw) throw new UsageError('give --permits or --read-write, not both');
  if (maxReaders !== undefined && !rw) throw new UsageError('--max-readers goes with --read-write');
  const out = await withLocker(o, async (locker) => {
    if (permits !== undefined) return { key: o.key, ...(await locker.inspectPermits(o.key, { limit: permits })) };
    if (rw) return { key: o.key, ...(await locker.inspectReadWrite(o.key, { maxReaders })) };
    if (o.key !== undefined) return { key: o.key, ...(await locker.inspect(o.key)) };
    return locker.list({ prefix: o.prefix, limit });
  });
  if (o.json) process.stdout.write(`${JSON.stringify(out)}\n`);
  else if (permits !== undefined) {
    process.stdout.write(`semaphore ${JSON.stringify(o.key)}: ${out.held} of ${out.limit} permits held\n${out.held ? `${table(out.holders)}\n` : ''}`);
  } else if (rw) {
    const holders = [...(out.writer ? [out.writer] : []), ...out.readers];
    const who = `${out.writer ? 'a writer' : 'no writer'}, ${out.readers.length} reader(s)`;
    process.stdout.write(`read-write lock ${JSON.stringify(o.key)}: ${who}\n${holders.length ? `${table(holders)}\n` : ''}`);
  } else if (!Array.isArray(out)) {
    process.stdout.write(out.held ? `${table([out])}\n` : `${JSON.stringify(out.key)} is free (no lease holds it)\n`);
  } else if (out.length === 0) {
    process.stdout.write(`no held keys${o.prefix === '' ? '' : ` start with ${JSON.stringify(o.prefix)}`}\n`);
  } else process.stdout.write(`${table(out)}\n`);
  return 0;
}

async function releaseCommand(args) {
  const o = parseOperator(args, RELEASE_OPTIONS, 'release');
  if (o.help) {
    process.stdout.write(`${RELEASE_USAGE}\n`);
    return 0;
  }
  if (o.key === undefined) throw new UsageError('--key is required');
  const key = JSON.stringify(o.key);
  return withLocker(o, async (locker) => {
    const before = await locker.inspect(o.key);
    const whose = before.holder === undefined ? '' : ` held by ${JSON.stringify(before.holder)}`;
    const left = before.ttlLeft === undefined ? '' : `, ${formatDuration(before.ttlLeft)} left`;
    if (!o.force) {
      const what = before.held ? `would remove the lease on ${key}${whose}${left}` : `${key} is not held now; nothing would be removed`;
      say(`${what}.\nNothing was released: a forced release does not tell the holder, which may go on writing until its next extension. Add --force to release it.`);
      return EXIT.usage;
    }
    if (await locker.forceRelease(o.key)) {
      process.stdout.write(`released ${key}${whose}\n`);
      return 0;
    }
    process.stdout.write(`${key} was not held; nothing was released\n`);
    return 1;
  });
}

/** The subcommands: usage line for the overview, and the function that runs one. */
const COMMANDS = {
  run: { summary: 'run a command while holding a lock', usage: RUN_USAGE, main: run },
  doctor: { summary: 'check a deployment against what the locks rely on', usage: DOCTOR_USAGE, main: doctor },
  inspect: { summary: 'show the held locks, their time left, fence and holder', usage: INSPECT_USAGE, main: inspectCommand },
  release: { summary: 'release a lock by force (--force), whoever holds it', usage: RELEASE_USAGE, main: releaseCommand },
};

function mainUsage() {
  const width = Math.max(...Object.keys(COMMANDS).map((n) => n.length));
  const list = Object.entries(COMMANDS)
    .map(([name, c]) => `  ${name.padEnd(width)}  ${c.summary}`)
    .join('\n');
  return `Usage: locco-rs <command> [options]

Commands:
${list}

Run locco-rs <command> --help for a command's options.
Options: -h, --help (this text), --version.

${EXIT_CODES_HELP}`;
}

async function main(argv) {
  const [name, ...rest] = argv;
  if (name === undefined) {
    process.stderr.write(`${mainUsage()}\n`);
    return EXIT.usage;
  }
  if (name === '--help' || name === '-h' || name === 'help') {
    const topic = name === 'help' && Object.hasOwn(COMMANDS, rest[0]) ? COMMANDS[rest[0]] : undefined;
    process.stdout.write(`${topic ? topic.usage : mainUsage()}\n`);
    return 0;
  }
  if (name === '--version') {
    process.stdout.write(`${version}\n`);
    return 0;
  }
  const command = Object.hasOwn(COMMANDS, name) ? COMMANDS[name] : undefined;
  if (command === undefined) {
    const guess = closest(name.replace(/^-+/, ''), [...Object.keys(COMMANDS), 'help', 'version']);
    const hint = guess === undefined ? '' : ` did you mean ${['help', 'version'].includes(guess) ? `--${guess}` : guess}?`;
    throw new UsageError(`unknown command ${JSON.stringify(name)};${hint} the commands are: ${Object.keys(COMMANDS).join(', ')}`);
  }
  return command.main(rest);
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (error) => {
    if (error instanceof UsageError) {
      say(`${error.message}\nRun locco-rs --help for usage.`);
      process.exit(EXIT.usage);
    }
    if (error instanceof ExitError) {
      say(error.message);
      process.exit(error.code);
    }
    const mapped = asExit(error, undefined);
    say(mapped.message);
    process.exit(mapped instanceof UsageError ? EXIT.usage : mapped.code);
  },
);
