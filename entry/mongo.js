'use strict';

module.exports = require('../lib/backends/mongo.js');
