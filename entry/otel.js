'use strict';

const { lockMetrics } = require('../lib/otel.js');

module.exports = { lockMetrics };
