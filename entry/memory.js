'use strict';

const { InMemoryAdapter } = require('../lib/backends/memory.js');

module.exports = { InMemoryAdapter };
