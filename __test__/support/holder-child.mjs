// Takes one holder (a permit, a read or the write) with auto-extension, prints "held" and
// keeps it until it is killed: the crashed holder of __test__/locker/holders.test.mjs.
import { Locker } from 'locco-rs';
import { adapterFor } from './holder-backends.mjs';

const { spec, method, key, options } = JSON.parse(process.argv[2]);
const locker = new Locker({ adapter: adapterFor(spec) });
await locker[method](key, { ...options, autoExtend: { maxHold: 600_000 } });
process.stdout.write('held\n');
setInterval(() => {}, 1000);
