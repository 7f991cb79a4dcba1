'use strict';

module.exports = require('../lib/mongo.js');
