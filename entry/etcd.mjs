import cjs from './etcd.js';

export const { EtcdAdapter } = cjs;
