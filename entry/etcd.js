'use strict';

module.exports = require('../lib/etcd.js');
