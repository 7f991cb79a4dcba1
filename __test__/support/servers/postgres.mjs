// PostgreSQL test servers.
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort } from './common.mjs';

/** The PostgreSQL binaries: the newest /usr/lib/postgresql/<n>/bin. */
export function pgBin() {
  const dirs = execFileSync('sh', ['-c', 'ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1'], {
    encoding: 'utf8',
  }).trim();
  if (!dirs) throw new Error('PostgreSQL is not installed: run scripts/test-all.sh, which installs it');
  return dirs;
}

/**
 * Starts PostgreSQL: initdb as the postgres user into a temp dir, a free port, password auth
 * over TCP (superuser postgres, password `postgres-pw`). `ssl`: { cert, key } file contents.
 */
export async function startPostgres({ ssl, maxConnections } = {}) {
  const bin = pgBin();
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'locco-pg-'));
  const data = join(dir, 'data');
  const asPg = (cmd) => execFileSync('su', ['postgres', '-s', '/bin/sh', '-c', cmd], { stdio: 'pipe' });
  writeFileSync(join(dir, 'pw'), 'postgres-pw\n');
  execFileSync('chown', ['-R', 'postgres:postgres', dir]);
  asPg(`${bin}/initdb -D ${data} -U postgres --pwfile=${dir}/pw --auth-host=scram-sha-256 --auth-local=trust -E UTF8 >/dev/null`);
  let options = `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off`;
  if (maxConnections) options += ` -c max_connections=${maxConnections}`;
  if (ssl) {
    writeFileSync(join(data, 'server.crt'), ssl.cert);
    writeFileSync(join(data, 'server.key'), ssl.key, { mode: 0o600 });
    execFileSync('chown', ['postgres:postgres', join(data, 'server.crt'), join(data, 'server.key')]);
    options += ' -c ssl=on';
  }
  const start = () => asPg(`${bin}/pg_ctl -D ${data} -o "${options}" -l ${dir}/log -w start >/dev/null`);
  start();
  const admin = `postgres://postgres:postgres-pw@127.0.0.1:${port}/postgres`;
  return {
    port,
    url: admin,
    urlFor: (user, password) => `postgres://${user}:${password}@127.0.0.1:${port}/postgres`,
    /** Runs SQL as the superuser through psql (the simple query protocol). */
    psql(sql) {
      return execFileSync('psql', [admin, '-v', 'ON_ERROR_STOP=1', '-qAt', '-c', sql], { encoding: 'utf8' }).trim();
    },
    /** A psql process of its own, fed `sql` on stdin; kill() ends it. */
    session(sql) {
      const child = spawn('psql', [admin, '-v', 'ON_ERROR_STOP=1', '-q'], { stdio: ['pipe', 'ignore', 'ignore'] });
      child.stdin.write(sql);
      return child;
    },
    async restart() {
      asPg(`${bin}/pg_ctl -D ${data} -m immediate stop >/dev/null`);
      start();
    },
    async dispose() {
      try {
        asPg(`${bin}/pg_ctl -D ${data} -m immediate stop >/dev/null`);
      } catch {
        // already stopped
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
