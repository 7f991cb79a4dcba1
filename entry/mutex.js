'use strict';

module.exports = require('../lib/mutex.js');
