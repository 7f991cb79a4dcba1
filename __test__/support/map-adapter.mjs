// A reference lock adapter in plain JavaScript over a Map, and broken variants of it, one per
// contract rule, to prove the contract suite catches each.

export class MapAdapter {
  constructor({ now = () => performance.now() } = {}) {
    this.now = now;
    this.entries = new Map();
    this.fences = new Map();
  }

  live(key) {
    const e = this.entries.get(key);
    return e && e.expiresAt > this.now() ? e : undefined;
  }

  async acquire({ key, token, ttl }) {
    if (this.live(key)) return false;
    this.entries.set(key, { token, expiresAt: this.now() + ttl });
    return true;
  }

  async release({ key, token }) {
    const e = this.live(key);
    if (!e || e.token !== token) return false;
    this.entries.delete(key);
    return true;
  }

  async extend({ key, token, ttl }) {
    const e = this.live(key);
    if (!e || e.token !== token) return false;
    e.expiresAt = this.now() + ttl;
    return true;
  }

  async isHeld({ key, token }) {
    const e = this.live(key);
    return Boolean(e && e.token === token);
  }

  async acquireFenced({ key, token, ttl }) {
    if (!(await this.acquire({ key, token, ttl }))) return null;
    const fence = (this.fences.get(key) ?? 0) + 1;
    this.fences.set(key, fence);
    return fence;
  }
}

/**
 * The reference adapter with the optional queue methods: a FIFO of places per key, each with
 * its own lease; a release wakes the head through watchQueue.
 */
export class QueuedMapAdapter extends MapAdapter {
  constructor(options) {
    super(options);
    this.queues = new Map(); // key -> [{ waiter, expiresAt }]
    this.wake = () => {};
  }

  head(key) {
    const q = (this.queues.get(key) ?? []).filter((p) => p.expiresAt > this.now());
    this.queues.set(key, q);
    return q[0]?.waiter;
  }

  wakeHead(key) {
    const head = this.live(key) ? undefined : this.head(key);
    if (head !== undefined) {
      this.wake(head);
    }
  }

  async acquire({ key, token, ttl }) {
    if (this.head(key) !== undefined) return false;
    return super.acquire({ key, token, ttl });
  }

  async release(input) {
    const released = await super.release(input);
    if (released) this.wakeHead(input.key);
    return released;
  }

  async acquireQueued({ key, token, ttl, waiter, lease, fenced }) {
    const head = this.head(key);
    if (!this.live(key) && (head === undefined || head === waiter)) {
      this.queues.get(key).shift();
      this.entries.set(key, { token, expiresAt: this.now() + ttl });
      if (!fenced) return { granted: true };
      const fence = (this.fences.get(key) ?? 0) + 1;
      this.fences.set(key, fence);
      return { granted: true, fence };
    }
    const q = this.queues.get(key);
    const place = q.find((p) => p.waiter === waiter);
    if (place) place.expiresAt = this.now() + lease;
    else q.push({ waiter, expiresAt: this.now() + lease });
    const holder = this.live(key);
    return q[0].waiter === waiter && holder ? { granted: false, retryIn: holder.expiresAt - this.now() } : { granted: false };
  }

  async leaveQueue({ key, waiter }) {
    const q = this.queues.get(key) ?? [];
    this.queues.set(key, q.filter((p) => p.waiter !== waiter));
    if (q[0]?.waiter === waiter) this.wakeHead(key);
  }

  watchQueue(wake) {
    this.wake = wake;
  }
}

/** The same adapter without fencing. */
export class UnfencedMapAdapter extends MapAdapter {}
UnfencedMapAdapter.prototype.acquireFenced = undefined;

export const brokenAdapters = {
  'release ignores the token': class extends MapAdapter {
    async release({ key }) {
      return this.entries.delete(key);
    }
  },
  'extend ignores the token': class extends MapAdapter {
    async extend({ key, ttl }) {
      const e = this.live(key);
      if (!e) return false;
      e.expiresAt = this.now() + ttl;
      return true;
    }
  },
  'extend revives an expired key': class extends MapAdapter {
    async extend({ key, token, ttl }) {
      const e = this.entries.get(key);
      if (!e || e.token !== token) return false;
      e.expiresAt = this.now() + ttl;
      return true;
    }
  },
  'an expired key stays taken': class extends MapAdapter {
    async acquire({ key, token, ttl }) {
      if (this.entries.has(key)) return false;
      this.entries.set(key, { token, expiresAt: this.now() + ttl });
      return true;
    }
  },
  'isHeld ignores expiry': class extends MapAdapter {
    async isHeld({ key, token }) {
      return this.entries.get(key)?.token === token;
    }
  },
  'acquire is not atomic': class extends MapAdapter {
    async acquire({ key, token, ttl }) {
      const free = !this.live(key);
      await new Promise((r) => setImmediate(r));
      if (!free) return false;
      this.entries.set(key, { token, expiresAt: this.now() + ttl });
      return true;
    }
  },
  'extend adds to the old TTL': class extends MapAdapter {
    async extend({ key, token, ttl }) {
      const e = this.live(key);
      if (!e || e.token !== token) return false;
      e.expiresAt += ttl;
      return true;
    }
  },
  'fences do not grow': class extends MapAdapter {
    async acquireFenced(input) {
      return (await this.acquire(input)) ? 7 : null;
    }
  },
  'acquireFenced answers a number when held': class extends MapAdapter {
    async acquireFenced(input) {
      const fence = await super.acquireFenced(input);
      return fence ?? 0;
    }
  },
  'a plain acquire barges past a waiter': class extends QueuedMapAdapter {
    async acquire(input) {
      return MapAdapter.prototype.acquire.call(this, input);
    }
  },
  'the queue serves the newest waiter first': class extends QueuedMapAdapter {
    head(key) {
      const q = (this.queues.get(key) ?? []).filter((p) => p.expiresAt > this.now());
      this.queues.set(key, q);
      return q[q.length - 1]?.waiter;
    }
  },
  'a release wakes nobody': class extends QueuedMapAdapter {
    watchQueue() {}
  },
};
