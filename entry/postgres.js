'use strict';

module.exports = require('../lib/postgres.js');
