export default {
  test: {
    include: ['__test__/**/*.vitest.mjs'],
    testTimeout: 20_000,
  },
};
