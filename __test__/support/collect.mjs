// A minimal runner: collects the tests a suite registers and runs them, to count failures.
export async function runCollected(register) {
  const tests = [];
  const before = [];
  const after = [];
  register({
    describe: (_name, fn) => fn(),
    it: (name, fn) => tests.push({ name, fn }),
    beforeEach: (fn) => before.push(fn),
    afterEach: (fn) => after.push(fn),
  });
  const failed = [];
  // One at a time: the suite's hooks share state between a test and its beforeEach.
  for (const { name, fn } of tests) {
    try {
      for (const b of before) await b();
      await fn({ skip() {} });
    } catch (error) {
      failed.push(`${name}: ${error.message}`);
    } finally {
      for (const a of after) await a();
    }
  }
  return { total: tests.length, failed };
}
