import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { it } from 'node:test';

it('no timer or handle of the library keeps the process alive', () => {
  const script = `
    const { Locker } = require('locco-rs');
    const { InMemoryAdapter } = require('locco-rs/memory');
    const locker = new Locker({ adapter: new InMemoryAdapter(), onEvent: () => {} });
    locker.acquire('k', { ttl: 60000, autoExtend: { maxHold: 3600000 } }).then((lock) => {
      lock.signal; // a watched lock with a heartbeat, never released
      console.log('held');
    });
  `;
  const started = Date.now();
  const r = spawnSync(process.execPath, ['-e', script], { cwd: new URL('../..', import.meta.url), timeout: 20_000 });
  assert.equal(r.status, 0, String(r.stderr));
  assert.equal(String(r.stdout).trim(), 'held');
  assert.ok(Date.now() - started < 10_000, 'the process exited on its own');
});
