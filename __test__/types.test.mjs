import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { it } from 'node:test';

const require = createRequire(import.meta.url);
const project = new URL('./types/tsconfig.json', import.meta.url).pathname;

for (const pkg of ['typescript-5.2', 'typescript']) {
  const { version } = require(`${pkg}/package.json`);
  it(`the declarations compile with TypeScript ${version}`, () => {
    const tsc = require.resolve(`${pkg}/bin/tsc`);
    const r = spawnSync(process.execPath, [tsc, '-p', project], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stdout + r.stderr);
  });
}
