// Runs a Node script in a child process for a test: the CLI, an example.
import { spawn } from 'node:child_process';
import { join } from 'node:path';

const root = new URL('../..', import.meta.url).pathname;

/**
 * Runs `node <args…>`; settles with { code, stdout, stderr } when it exits. A child still
 * running after `timeout` ms is killed (its code is then null, which fails the test's checks).
 */
export function runNode(args, { cwd = root, env = {}, timeout = 30_000 } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, args, { cwd, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeout);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

/** `locco-rs <args…>` (bin/locco-rs.js of this checkout), as {@link runNode}. */
export const runCli = (args, options) => runNode([join(root, 'bin', 'locco-rs.js'), ...args], options);
