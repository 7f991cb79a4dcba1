'use strict';

const { InMemoryAdapter } = require('../lib/adapters.js');

module.exports = { InMemoryAdapter };
