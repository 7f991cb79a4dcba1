export default {
  test: {
    include: ['__test__/vitest/**/*.vitest.mjs'],
    testTimeout: 20_000,
  },
};
