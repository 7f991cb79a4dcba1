'use strict';

module.exports = require('../lib/backends/postgres.js');
