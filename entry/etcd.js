'use strict';

module.exports = require('../lib/backends/etcd.js');
