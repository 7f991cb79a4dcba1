// A loopback TCP proxy that delays, cuts or stalls the connections to a test server.
import { connect, createServer } from 'node:net';
import { sleep } from './common.mjs';

/**
 * A loopback TCP proxy to `port`. `delay` holds each new connection that many ms before it
 * connects through (a slow network for a client's first connection); `cut()` drops every
 * connection and stops listening (a connect is refused) until `restore()`; `stall(ms)` holds
 * every byte in both directions for `ms` (a network that stops, then delivers), resolving once
 * they have been passed on; `urlFor(url)` is `url` with its port pointed at the proxy.
 * Returns { port, urlFor, cut, restore, stall, close }.
 */
export async function testProxy(port, { delay = 0 } = {}) {
  const sockets = new Set();
  let held; // the bytes kept while stalled: [socket, chunk][]
  const forward = (from, to) =>
    from.on('data', (chunk) => {
      if (held !== undefined) held.push([to, chunk]);
      else to.write(chunk);
    });
  const server = createServer((client) => {
    sockets.add(client);
    client.on('close', () => sockets.delete(client));
    client.on('error', () => {});
    client.pause();
    setTimeout(() => {
      if (client.destroyed) return;
      const upstream = connect(port, '127.0.0.1');
      sockets.add(upstream);
      upstream.on('error', () => client.destroy());
      upstream.on('close', () => {
        sockets.delete(upstream);
        client.destroy();
      });
      client.on('close', () => upstream.destroy());
      forward(client, upstream);
      forward(upstream, client);
      client.resume();
    }, delay);
  });
  const listen = (at) => new Promise((resolve) => server.listen(at, '127.0.0.1', resolve));
  const stop = () => {
    const closed = new Promise((resolve) => server.close(resolve));
    for (const s of sockets) s.destroy();
    return closed;
  };
  const stall = async (ms) => {
    held = [];
    await sleep(ms);
    const kept = held;
    held = undefined;
    for (const [to, chunk] of kept) if (!to.destroyed) to.write(chunk);
  };
  await listen(0);
  const own = server.address().port;
  const urlFor = (url) => {
    const proxied = new URL(url);
    proxied.port = String(own);
    return proxied.href;
  };
  return { port: own, urlFor, cut: stop, restore: () => listen(own), stall, close: () => (server.listening ? stop() : undefined) };
}
