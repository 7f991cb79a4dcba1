// Job deduplication: the same job arrives at several workers (a retried message, a cron that
// fires on every instance). Each worker tries the job's key once; only the one that gets it runs
// the job. The lock is kept for its TTL after the job ends, so a duplicate arriving a little
// later is skipped too.
// Run: node examples/job-dedup.mjs
import { Locker } from 'locco-rs';
import { InMemoryAdapter } from 'locco-rs/memory';

const locker = new Locker({ adapter: new InMemoryAdapter() });
const ran = [];

async function handle(worker, jobId) {
  // ttl: the dedup window. No release: the key stays taken until the window ends.
  const claim = await locker.tryAcquire(`job:${jobId}`, { ttl: 60_000 });
  if (claim === null) {
    console.log(`${worker}: job ${jobId} is taken, skipped`);
    return;
  }
  ran.push(`${worker}:${jobId}`);
  console.log(`${worker}: runs job ${jobId}`);
}

// Job 1 arrives at three workers at once, job 2 at two of them.
await Promise.all([handle('w1', 1), handle('w2', 1), handle('w3', 1), handle('w2', 2), handle('w3', 2)]);
// A late duplicate of job 1, inside the window.
await handle('w1', 1);

console.log(`ran: ${ran.join(', ')}`);
if (ran.length !== 2) throw new Error(`each job should run once, ran ${ran.length} times`);
// A plain close() (or `await using`) would release the claims and end the window early;
// release: false only stops the Locker, and each claim stays until its ttl ends.
await locker.close({ release: false });
