// A child process (or worker thread) holding mutexes over a shared Redis, driven by messages.
// argv / workerData: { url, role }. Roles:
//   hold <id>: takes <id>, tells 'held', keeps it until killed.
//   cross <first> <second>: takes <first>, tells 'holding', waits for 'go', then takes <second>;
//     tells { result } or { error: { name, cycle } }.
//   serial <id> <n>: n operations on <id>, each telling { enter } and { leave }; then 'done'.
import { parentPort, workerData } from 'node:worker_threads';
import { MutexManager } from 'locco-rs/mutex';

const args = workerData ?? JSON.parse(process.argv[2]);
const send = (m) => (parentPort ? parentPort.postMessage(m) : process.send(m));
const onMessage = (fn) => (parentPort ? parentPort.on('message', fn) : process.on('message', fn));
const manager = new MutexManager({ redis: { url: args.url }, namespace: 'cross', lockTTL: args.lockTTL ?? 2000 });

if (args.role === 'hold') {
  await manager.runOperation(args.id, async () => {
    send('held');
    await new Promise(() => {});
  });
} else if (args.role === 'cross') {
  let go;
  const started = new Promise((r) => (go = r));
  onMessage((m) => m === 'go' && go());
  try {
    const result = await manager.runOperation(args.first, async () => {
      send('holding');
      await started;
      return manager.runOperation(args.second, () => `${args.first} then ${args.second}`);
    });
    send({ result });
  } catch (error) {
    send({ error: { name: error.name, cycle: error.cycle } });
  }
  await manager.dispose();
  if (!parentPort) process.disconnect();
} else if (args.role === 'serial') {
  for (let i = 0; i < args.n; i++) {
    await manager.runOperation(args.id, async () => {
      // Enter, pause, leave: the parent checks that no two holders interleave.
      send({ enter: args.tag });
      await new Promise((r) => setTimeout(r, 2));
      send({ leave: args.tag });
    });
  }
  send('done');
  await manager.dispose();
  if (!parentPort) process.disconnect();
}
