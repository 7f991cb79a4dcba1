//! A model of the Redis backend's lock protocol, as several processes run it together: the
//! scripts of `crates/locco-core/src/backend/redis/scripts.rs` (the `locco:reserved|…` and
//! `|locco:waited` marks, the queue's places and their deadlines, the pushes that say "try
//! now", the fencing counter) and the engine's side of it (a first attempt that is a plain
//! try, a join in the same attempt, re-checks at least once per tick, a local lease counted
//! from when the request left and ending early by a margin, late grants given back).
//!
//! Time is discrete: one tick is the queue's re-check interval (1 s), a place's lease is 3
//! ticks (3 s). A process's clock may run slow: its local lease then ends up to the margin
//! later in real time than on a correct clock, which at model scale is the whole margin.
//! Messages may be delayed across ticks, reordered, lost, or delivered after the sender's lease
//! ended; a process may crash, or pause and resume; the server may restart without
//! persistence. [`Protocol`] is a `stateright` model; the server's half, [`Server::run`], is
//! also what the conformance test replays as real script calls.
//!
//! What keeps the state space small without losing what the server can tell apart: timers
//! that are due run at the tick; before `quiet_from`, faults, starts and releases come at a
//! tick's start (later in the tick is the same to the server, whose messages may be delayed
//! anyway); identical pushes in flight merge (a push only sets a flag); fences are checked
//! where they are made and not carried in answers; from `quiet_from` on the run is one fair
//! schedule, in which holders keep the key until their lease ends.

use std::fmt;

use stateright::{Model, Property};

/// A rule broken on purpose: the checker must find a counterexample for each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// A release that deletes (or hands over) the key whatever its token.
    ReleaseIgnoresToken,
    /// A head that counts its lease from the push that woke it, not from its request.
    LeaseFromPush,
    /// A holder that counts its lease from the answer, not from its request.
    LeaseFromAnswer,
    /// A hand-over that reserves the key for the first place in the queue even when that
    /// place's deadline passed.
    HandOffIgnoresDeadline,
    /// A local lease that does not end early: a slow clock then outlives the server's lease.
    NoMargin,
    /// Fences from the counter alone, without the server's time: a restart that loses the
    /// counter starts them again.
    FenceWithoutTime,
}

pub const MUTATIONS: [Mutation; 6] = [
    Mutation::ReleaseIgnoresToken,
    Mutation::LeaseFromPush,
    Mutation::LeaseFromAnswer,
    Mutation::HandOffIgnoresDeadline,
    Mutation::NoMargin,
    Mutation::FenceWithoutTime,
];

/// How many faults of each kind a run may have, all before `quiet_from`.
#[derive(Clone, Debug)]
pub struct Faults {
    pub crash: u8,
    pub loss: u8,
    pub restart: u8,
    pub pause: u8,
    /// Acquisitions given up while queued (aborted, out of time): they leave the queue.
    pub leave: u8,
}

#[derive(Clone, Debug)]
pub struct Protocol {
    /// The process of each waiter (a process may have two).
    pub process_of: Vec<u8>,
    /// The key each waiter wants.
    pub key_of: Vec<u8>,
    pub keys: u8,
    /// Acquisitions each waiter makes, one after the other.
    pub acquisitions: u8,
    /// The server's lease of a grant, in ticks.
    pub ttl: u8,
    /// How much earlier than the server's lease the local lease ends on a correct clock: the
    /// engine's 1% of the TTL; a clock that runs slow uses all of it.
    pub margin: u8,
    /// A place's lease (the engine's 3 s).
    pub place_lease: u8,
    /// No tick past this one.
    pub horizon: u8,
    pub faults: Faults,
    /// From this tick on: no fault, every message is delivered within its tick, every
    /// process acts when due, and every waiter that wants the key starts at once.
    pub quiet_from: u8,
    /// docs/fair-queue.md allows a newcomer's try to take a key whose holder's lease ran out,
    /// past live waiters, until the head looks again. The scripts allow more in that window:
    /// a key whose reservation ran out (its head's place did) is as free, and a newcomer that
    /// took the key holds it without the `|locco:waited` mark, so its release deletes the key
    /// and the next newcomer may take it too. On: any plain try's grant in the window (a lease
    /// ran out and no queued attempt has looked at the key since) counts as allowed; off: only
    /// the first grant after a holder's lease ran out.
    pub lapse_window_is_exception: bool,
    /// Whether each process's clock runs slow (its local lease ends the margin later in real
    /// time). Slow is the unsafe side.
    pub slow_clocks: Vec<bool>,
    pub mutation: Option<Mutation>,
}

impl Protocol {
    /// 3 processes with one waiter each on one key, and one crash, one lost message, one
    /// server restart, one pause and one waiter giving up before `quiet_from`.
    pub fn standard() -> Self {
        Protocol {
            process_of: vec![0, 1, 2],
            key_of: vec![0, 0, 0],
            keys: 1,
            acquisitions: 1,
            ttl: 3,
            margin: 1,
            place_lease: 3,
            horizon: 16,
            faults: Faults {
                crash: 1,
                loss: 1,
                restart: 1,
                pause: 1,
                leave: 1,
            },
            quiet_from: 3,
            lapse_window_is_exception: true,
            slow_clocks: vec![true; 3],
            mutation: None,
        }
    }

    /// 3 processes, the first with a waiter on each of two keys, the others with one each;
    /// one crash, one lost message and one restart (no pause, no waiter giving up: those are
    /// covered on one key, and two keys with them take minutes).
    pub fn two_keys() -> Self {
        Protocol {
            process_of: vec![0, 0, 1, 2],
            key_of: vec![0, 1, 0, 1],
            keys: 2,
            faults: Faults {
                crash: 1,
                loss: 1,
                restart: 1,
                pause: 0,
                leave: 0,
            },
            ..Protocol::standard()
        }
    }

    pub fn waiters(&self) -> usize {
        self.process_of.len()
    }

    fn processes(&self) -> usize {
        self.process_of
            .iter()
            .map(|&p| p as usize + 1)
            .max()
            .unwrap_or(0)
    }

    /// The real tick at which a local lease counted from `start` ends, for a process whose
    /// clock is slow or not.
    pub fn local_end(&self, start: u8, slow: bool) -> u8 {
        let early = match (slow, self.mutation) {
            (_, Some(Mutation::NoMargin)) => 0,
            (true, _) => 0,
            (false, _) => self.margin,
        };
        // A slow clock's lease ends the margin later in real time than a correct one's; with
        // NoMargin it ends at the server's lease end on a correct clock, and past it when slow.
        let late = matches!(self.mutation, Some(Mutation::NoMargin)) && slow;
        (start + self.ttl - early + late as u8).min(u8::MAX - 1)
    }

    fn quiet(&self, now: u8) -> bool {
        now >= self.quiet_from
    }
}

// ---------------------------------------------------------------------------------------------
// The server

/// A lock's value.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Val {
    /// Held under a token; `waited`: the `|locco:waited` mark.
    Held { tok: Tok, waited: bool },
    /// `locco:reserved|<place>`: kept for the head.
    Reserved(u8),
}

/// A token: the waiter and its attempt number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tok {
    pub w: u8,
    pub n: u16,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Key {
    /// The value and the tick its lease ends (gone at that tick).
    pub val: Option<(Val, u8)>,
    /// The queue (`<key>:locco-q`), oldest first, and when the list expires.
    pub queue: Vec<u8>,
    pub queue_exp: u8,
    /// Each place's deadline (`<key>:locco-qt`), by waiter, and when the set expires.
    pub places: Vec<(u8, u8)>,
    pub places_exp: u8,
    /// The fencing counter (it outlives every horizon).
    pub fence: Option<u32>,
    /// Ghost: the value's lease ran out, and nothing wrote the key since.
    pub lapsed: Option<Freed>,
    /// Ghost: a lease ran out and no queued attempt has looked at the key since.
    pub window: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Server {
    pub keys: Vec<Key>,
    /// Grants so far within this tick: the server's clock in µs moves on between two grants
    /// (it is part of every fence). Not data: a restart keeps it.
    pub grants_this_tick: u8,
}

/// A script call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Call {
    /// A try or first attempt: TRY_FENCED.
    Try { key: u8, tok: Tok },
    /// A queued attempt: the acquire script, for the place of `tok.w`.
    Acquire { key: u8, tok: Tok },
    /// RELEASE: a release or a give-back.
    Release { key: u8, tok: Tok },
    /// LEAVE: gives up the place of waiter `w`.
    Leave { key: u8, w: u8 },
}

/// What a script answered, and what it published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Effect {
    pub granted: Option<u32>,
    /// A queued attempt not granted: whether it got a hint (the ms left of the holder's lease,
    /// when at the head or with nobody ahead).
    pub hint: bool,
    /// Release, leave: the integer answer.
    pub int: i64,
    /// Waiters pushed (their places), in order.
    pub pushes: Vec<u8>,
    /// A plain try took a key that was free because a lease ran out: a holder's, or a
    /// reservation's.
    pub freed_by: Option<Freed>,
    /// A queued attempt took a new place at the back of the queue.
    pub joined: bool,
    /// A plain try's grant came while a lease that ran out left the key free and no waiter
    /// had looked at it since.
    pub in_window: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Freed {
    HolderLease,
    Reservation,
}

impl Key {
    /// Drops what expired by `now`, as Redis does on access; answers what the value was.
    fn expire(&mut self, now: u8) -> Option<Val> {
        let mut gone = None;
        if let Some((v, exp)) = &self.val {
            if *exp <= now {
                gone = Some(v.clone());
                self.window = true;
                self.lapsed = Some(match v {
                    Val::Held { .. } => Freed::HolderLease,
                    Val::Reserved(_) => Freed::Reservation,
                });
                self.val = None;
            }
        }
        if !self.queue.is_empty() && self.queue_exp <= now {
            self.queue.clear();
        }
        if !self.places.is_empty() && self.places_exp <= now {
            self.places.clear();
        }
        gone
    }

    fn score(&self, w: u8) -> Option<u8> {
        self.places.iter().find(|p| p.0 == w).map(|p| p.1)
    }

    fn zrem(&mut self, w: u8) {
        self.places.retain(|p| p.0 != w);
    }

    fn lpop(&mut self) {
        self.queue.remove(0);
    }

    /// The prelude's `head`: the longest live place and its deadline, after dropping the
    /// places at the front whose lease ran out.
    fn head(&mut self, now: u8, m: Option<Mutation>) -> Option<(u8, u8)> {
        loop {
            let h = *self.queue.first()?;
            let d = self.score(h).unwrap_or(0);
            if d > now || m == Some(Mutation::HandOffIgnoresDeadline) {
                return Some((h, d));
            }
            self.lpop();
            self.zrem(h);
        }
    }

    fn reserve(&mut self, h: u8, d: u8, now: u8, pushes: &mut Vec<u8>) {
        // PX max(1, d - now): 1 ms rounds up to the next tick.
        self.set(Some((Val::Reserved(h), d.max(now + 1))));
        pushes.push(h);
    }

    fn hand_over(&mut self, now: u8, m: Option<Mutation>, pushes: &mut Vec<u8>) {
        if !self.queue.is_empty() {
            if let Some((h, d)) = self.head(now, m) {
                return self.reserve(h, d, now, pushes);
            }
        }
        self.set(None);
    }

    fn set(&mut self, val: Option<(Val, u8)>) {
        self.val = val;
        self.lapsed = None;
    }
}

impl Server {
    pub fn new(keys: u8) -> Self {
        Server {
            keys: vec![Key::default(); keys as usize],
            grants_this_tick: 0,
        }
    }

    /// The fencing token of a grant: at least the server's time, above the counter.
    fn grant(&mut self, key: usize, now: u8, m: Option<Mutation>) -> u32 {
        let time = match m {
            Some(Mutation::FenceWithoutTime) => 1,
            _ => now as u32 * 64 + self.grants_this_tick as u32 + 1,
        };
        self.grants_this_tick += 1;
        let k = &mut self.keys[key];
        let fence = match k.fence {
            Some(last) if last >= time => last + 1,
            _ => time,
        };
        k.fence = Some(fence);
        fence
    }

    /// Runs one script at tick `now`, as scripts.rs has it.
    pub fn run(&mut self, p: &Protocol, call: Call, now: u8) -> Effect {
        let m = p.mutation;
        let mut e = Effect {
            granted: None,
            hint: false,
            int: 0,
            pushes: vec![],
            freed_by: None,
            joined: false,
            in_window: false,
        };
        match call {
            Call::Try { key, tok } => {
                let k = &mut self.keys[key as usize];
                k.expire(now);
                if k.val.is_none() {
                    e.freed_by = k.lapsed;
                    e.in_window = k.window;
                    k.set(Some((Val::Held { tok, waited: false }, now + p.ttl)));
                    e.granted = Some(self.grant(key as usize, now, m));
                }
            }
            Call::Acquire { key, tok } => {
                let ki = key as usize;
                let k = &mut self.keys[ki];
                k.expire(now);
                k.window = false;
                let me = tok.w;
                let hd = k.head(now, m);
                let h = hd.map(|x| x.0);
                let v = k.val.as_ref().map(|x| x.0.clone());
                let free = match &v {
                    None => true,
                    Some(Val::Reserved(x)) => Some(*x) != h,
                    Some(Val::Held { .. }) => false,
                };
                if (free || v == Some(Val::Reserved(me))) && (h.is_none() || h == Some(me)) {
                    let mut waited = false;
                    if let Some(h) = h {
                        k.lpop();
                        k.zrem(h);
                        waited = !k.queue.is_empty();
                    }
                    k.set(Some((Val::Held { tok, waited }, now + p.ttl)));
                    e.granted = Some(self.grant(ki, now, m));
                    return e;
                }
                if free {
                    let (h, d) = hd.expect("a free key not granted has a head");
                    k.reserve(h, d, now, &mut e.pushes);
                } else if h.is_some() && v == Some(Val::Reserved(h.unwrap())) {
                    e.pushes.push(h.unwrap());
                } else if let Some((Val::Held { waited, .. }, _)) = &mut k.val {
                    *waited = true;
                }
                if k.score(me).is_none() {
                    k.queue.push(me);
                    e.joined = true;
                }
                k.zrem(me);
                k.places.push((me, now + p.place_lease));
                k.places.sort();
                k.queue_exp = now + p.place_lease;
                k.places_exp = now + p.place_lease;
                e.hint = h.is_none() || h == Some(me);
            }
            Call::Release { key, tok } => {
                let k = &mut self.keys[key as usize];
                k.expire(now);
                let (ours, waited) = match &k.val {
                    Some((Val::Held { tok: t, waited }, _)) => (
                        *t == tok || m == Some(Mutation::ReleaseIgnoresToken),
                        *waited,
                    ),
                    _ => (false, false),
                };
                if ours && !waited {
                    k.set(None);
                    e.int = 1;
                } else if ours {
                    k.hand_over(now, m, &mut e.pushes);
                    e.int = 1;
                }
            }
            Call::Leave { key, w } => {
                let k = &mut self.keys[key as usize];
                k.expire(now);
                k.queue.retain(|&x| x != w);
                k.zrem(w);
                let ours = |v: &Option<(Val, u8)>| match v {
                    None => true,
                    Some((Val::Reserved(x), _)) => *x == w,
                    _ => false,
                };
                if ours(&k.val) {
                    k.hand_over(now, m, &mut e.pushes);
                }
                e.int = 1;
            }
        }
        e
    }

    /// What the server holds at `now`, once expired data is dropped: the form the conformance
    /// test compares.
    pub fn visible(&self, now: u8) -> Vec<Key> {
        self.keys
            .iter()
            .map(|k| {
                let mut k = k.clone();
                k.expire(now);
                k
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// The processes

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Between acquisitions.
    Idle,
    /// An attempt in flight since `sent`; `lease_from`: the tick its local lease counts from
    /// (the acquisition's start for the join that follows a first try).
    Attempt {
        first: bool,
        sent: u8,
        lease_from: u8,
    },
    /// In the queue, next re-check at `next`.
    Waiting {
        next: u8,
    },
    /// Granted: held while the tick is before `end`. `epoch`: the server's life it was
    /// granted in.
    Held {
        end: u8,
        epoch: u8,
    },
    Done,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Waiter {
    pub phase: Phase,
    pub tok: u16,
    /// Asked for a place (the acquisition's later attempts are queued).
    pub place: bool,
    /// A push arrived and was not acted on yet.
    pub pushed: bool,
    /// The last tick a push arrived in this acquisition.
    pub push_at: Option<u8>,
    pub left: u8,
    pub granted: u8,
    pub gave_up: u8,
    /// Ghost: the order of this acquisition's first join (0: none yet).
    pub joined: u16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Proc {
    pub slow: bool,
    pub crashed: bool,
    pub paused: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Msg {
    /// A request, sent at tick `sent` by the waiter of its token.
    Req { call: Call, sent: u8 },
    /// An attempt's answer.
    /// `granted`: the server's life (restarts so far) it was granted in. (The fence is
    /// checked where it is made, against every fence before it.)
    Answer {
        tok: Tok,
        granted: Option<u8>,
        hint: bool,
    },
    /// "Try now", to the process of waiter `w`.
    Push { w: u8 },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub now: u8,
    pub server: Server,
    /// Ghost: server restarts so far.
    pub epoch: u8,
    pub procs: Vec<Proc>,
    pub waiters: Vec<Waiter>,
    /// In flight, sorted; identical pushes merge.
    pub net: Vec<Msg>,
    pub faults_used: [u8; 5],
    /// Ghosts: the highest fence granted per key; joins so far; the first broken rule.
    pub max_fence: Vec<u32>,
    pub joins: u16,
    pub broken: Option<Broken>,
    /// No step but faults since the last tick.
    pub fresh: bool,
}

/// A rule the server broke while running a step (the properties read it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Broken {
    FenceDidNotGrow,
    GrantedOutOfOrder,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Tick,
    /// Waiter `w` starts an acquisition: its first try.
    Start(u8),
    /// A queued attempt (on a push or the re-check).
    Recheck(u8),
    /// The attempt of `w` got no answer before its lease would end.
    NoAnswer(u8),
    Release(u8),
    /// A queued waiter gives up its acquisition: it leaves the queue.
    GiveUp(u8),
    /// The local lease of `w` ended: the lock reads lost.
    Lost(u8),
    /// A message in flight arrives.
    Deliver(Msg),
    Lose(Msg),
    Crash(u8),
    Pause(u8),
    Resume(u8),
    Restart,
}

const CRASH: usize = 0;
const LOSS: usize = 1;
const RESTART: usize = 2;
const PAUSE: usize = 3;
const LEAVE: usize = 4;

impl State {
    /// Whether waiter `w` reads `held` at the current tick.
    pub fn held(&self, w: usize) -> Option<(u8, u8)> {
        match self.waiters[w].phase {
            Phase::Held { end, epoch, .. } if self.now < end => Some((end, epoch)),
            _ => None,
        }
    }

    fn tok(&self, w: usize) -> Tok {
        Tok {
            w: w as u8,
            n: self.waiters[w].tok,
        }
    }

    fn send(&mut self, m: Msg) {
        // Identical requests (a give-back sent twice) stay two messages; pushes merge.
        match self.net.binary_search(&m) {
            Ok(_) if matches!(m, Msg::Push { .. }) => {}
            Ok(i) | Err(i) => self.net.insert(i, m),
        }
    }

    fn take(&mut self, m: &Msg) -> bool {
        match self.net.binary_search(m) {
            Ok(i) => {
                self.net.remove(i);
                true
            }
            Err(_) => false,
        }
    }
}

impl Protocol {
    fn alive(&self, s: &State, w: usize) -> bool {
        let p = &s.procs[self.process_of[w] as usize];
        !p.crashed && !p.paused
    }

    /// A new acquisition or the end, after a release or a loss.
    fn next_acquisition(w: &mut Waiter) {
        w.phase = if w.left > 0 { Phase::Idle } else { Phase::Done };
        w.place = false;
        w.pushed = false;
        w.push_at = None;
        w.joined = 0;
        w.tok += 1;
    }

    fn give_back(s: &mut State, key: u8, tok: Tok, now: u8) {
        s.send(Msg::Req {
            call: Call::Release { key, tok },
            sent: now,
        });
    }

    /// A queued attempt of `w`, under its current token, its lease counted from `from`.
    fn queued_attempt(&self, s: &mut State, w: usize, from: u8) {
        let now = s.now;
        let tok = s.tok(w);
        let key = self.key_of[w];
        let wt = &mut s.waiters[w];
        wt.pushed = false;
        wt.place = true;
        wt.phase = Phase::Attempt {
            first: false,
            sent: now,
            lease_from: from,
        };
        s.send(Msg::Req {
            call: Call::Acquire { key, tok },
            sent: now,
        });
    }

    /// After a miss that may have left a grant under the token (late, or no answer): a new
    /// token, a place, and a re-check at the next tick.
    fn missed(s: &mut State, w: usize) {
        let now = s.now;
        let wt = &mut s.waiters[w];
        wt.tok += 1;
        wt.place = true;
        wt.phase = Phase::Waiting { next: now + 1 };
    }

    /// The server runs `call`; its effects go to the network and the ghosts.
    fn serve(&self, s: &mut State, call: Call) {
        let now = s.now;
        let e = s.server.run(self, call, now);
        for &w in &e.pushes {
            s.send(Msg::Push { w });
        }
        if let (true, Call::Acquire { tok, .. }) = (e.joined, call) {
            // Ghost: the order of the waiter's place (a place lost and taken again is a new
            // one: the documented exception of a waiter that stopped renewing its place).
            s.joins += 1;
            s.waiters[tok.w as usize].joined = s.joins;
            // Only the order counts: renumbered 1.., so equal orders are equal states.
            let mut order: Vec<u16> = s
                .waiters
                .iter()
                .map(|w| w.joined)
                .filter(|&j| j > 0)
                .collect();
            order.sort_unstable();
            for w in &mut s.waiters {
                if w.joined > 0 {
                    w.joined = order.binary_search(&w.joined).unwrap() as u16 + 1;
                }
            }
            s.joins = order.len() as u16;
        }
        let (key, tok, queued) = match call {
            Call::Try { key, tok } => (key, tok, false),
            Call::Acquire { key, tok } => (key, tok, true),
            _ => return,
        };
        if let Some(fence) = e.granted {
            let k = key as usize;
            if fence <= s.max_fence[k] && s.broken.is_none() {
                s.broken = Some(Broken::FenceDidNotGrow);
            }
            s.max_fence[k] = s.max_fence[k].max(fence);
            let allowed = e.freed_by == Some(Freed::HolderLease)
                || (self.lapse_window_is_exception && e.in_window);
            if !allowed && s.broken.is_none() && self.passed_a_live_waiter(s, key, tok, queued) {
                s.broken = Some(Broken::GrantedOutOfOrder);
            }
        }
        s.send(Msg::Answer {
            tok,
            granted: e.granted.map(|_| s.epoch),
            hint: e.hint,
        });
    }

    /// A grant to `tok.w` while a waiter that joined earlier (and is not crashed) still has a
    /// live place in the queue.
    fn passed_a_live_waiter(&self, s: &State, key: u8, tok: Tok, _queued: bool) -> bool {
        let me = &s.waiters[tok.w as usize];
        let k = &s.server.keys[key as usize];
        k.queue.iter().any(|&v| {
            let wv = &s.waiters[v as usize];
            v != tok.w
                && !s.procs[self.process_of[v as usize] as usize].crashed
                && wv.joined != 0
                && (me.joined == 0 || wv.joined < me.joined)
                && k.score(v).is_some_and(|d| d > s.now)
        })
    }
}

impl Protocol {
    /// The timers that are due (a re-check, an attempt's limit, a lease's end, a start once
    /// quiet) run at once, waiter by waiter.
    fn run_due(&self, s: &mut State) {
        for w in 0..self.waiters() {
            while self.alive(s, w) {
                let slow = s.procs[self.process_of[w] as usize].slow;
                let wb = w as u8;
                let a = match s.waiters[w].phase {
                    Phase::Idle if s.waiters[w].left > 0 && self.quiet(s.now) => Action::Start(wb),
                    Phase::Attempt { sent, .. } if s.now >= self.local_end(sent, slow) => {
                        Action::NoAnswer(wb)
                    }
                    Phase::Waiting { next } if s.now >= next => Action::Recheck(wb),
                    Phase::Held { end, .. } if s.now >= end => Action::Lost(wb),
                    _ => break,
                };
                self.apply(s, a);
            }
        }
    }

    /// One step, applied to `s`.
    fn apply(&self, s: &mut State, a: Action) {
        let now = s.now;
        match a {
            Action::Tick => {
                s.now += 1;
                s.server.grants_this_tick = 0;
            }
            Action::Start(w) => {
                let w = w as usize;
                let (key, tok) = (self.key_of[w], s.tok(w));
                let wt = &mut s.waiters[w];
                wt.left -= 1;
                wt.phase = Phase::Attempt {
                    first: true,
                    sent: now,
                    lease_from: now,
                };
                s.send(Msg::Req {
                    call: Call::Try { key, tok },
                    sent: now,
                });
            }
            Action::Recheck(w) => self.queued_attempt(s, w as usize, now),
            Action::NoAnswer(w) => {
                let w = w as usize;
                let (key, tok) = (self.key_of[w], s.tok(w));
                Self::give_back(s, key, tok, now);
                Self::missed(s, w);
            }
            Action::Release(w) => {
                let w = w as usize;
                let (key, tok) = (self.key_of[w], s.tok(w));
                Self::give_back(s, key, tok, now);
                Self::next_acquisition(&mut s.waiters[w]);
            }
            Action::Lost(w) => Self::next_acquisition(&mut s.waiters[w as usize]),
            Action::GiveUp(w) => {
                let wi = w as usize;
                s.send(Msg::Req {
                    call: Call::Leave {
                        key: self.key_of[wi],
                        w,
                    },
                    sent: now,
                });
                s.faults_used[LEAVE] += 1;
                s.waiters[wi].gave_up += 1;
                Self::next_acquisition(&mut s.waiters[wi]);
            }
            Action::Deliver(m) => {
                s.take(&m);
                match m {
                    Msg::Req { call, .. } => self.serve(s, call),
                    Msg::Push { w } => {
                        let wi = w as usize;
                        let p = s.procs[self.process_of[wi] as usize];
                        let wt = &mut s.waiters[wi];
                        if !p.crashed
                            && matches!(wt.phase, Phase::Attempt { .. } | Phase::Waiting { .. })
                        {
                            wt.pushed = true;
                            if self.mutation == Some(Mutation::LeaseFromPush) {
                                wt.push_at = Some(now);
                            }
                        }
                    }
                    Msg::Answer {
                        tok,
                        granted,
                        hint: _,
                    } => {
                        let w = tok.w as usize;
                        let slow = s.procs[self.process_of[w] as usize].slow;
                        if s.procs[self.process_of[w] as usize].crashed {
                            return;
                        }
                        let key = self.key_of[w];
                        let current = s.waiters[w].tok == tok.n;
                        let attempt = match s.waiters[w].phase {
                            Phase::Attempt {
                                first, lease_from, ..
                            } if current => Some((first, lease_from)),
                            _ => None,
                        };
                        let Some((first, lease_from)) = attempt else {
                            // An attempt nobody waits for: its grant is given back.
                            if granted.is_some() {
                                Self::give_back(s, key, tok, now);
                            }
                            return;
                        };
                        match granted {
                            Some(epoch) => {
                                let start = match self.mutation {
                                    Some(Mutation::LeaseFromAnswer) => now,
                                    Some(Mutation::LeaseFromPush) => s.waiters[w]
                                        .push_at
                                        .map_or(lease_from, |p| p.max(lease_from)),
                                    _ => lease_from,
                                };
                                let end = self.local_end(start, slow);
                                if now >= self.local_end(lease_from, slow)
                                    && self.mutation != Some(Mutation::LeaseFromAnswer)
                                {
                                    // Too late to use: given back.
                                    Self::give_back(s, key, tok, now);
                                    Self::missed(s, w);
                                } else {
                                    let wt = &mut s.waiters[w];
                                    wt.granted += 1;
                                    wt.place = false;
                                    wt.phase = Phase::Held { end, epoch };
                                }
                            }
                            None if first => {
                                // Found taken: join at once, the lease counted from the start.
                                self.queued_attempt(s, w, lease_from);
                            }
                            None => {
                                s.waiters[w].phase = Phase::Waiting { next: now + 1 };
                            }
                        }
                    }
                }
            }
            Action::Lose(m) => {
                s.take(&m);
                s.faults_used[LOSS] += 1;
            }
            Action::Crash(p) => {
                s.procs[p as usize].crashed = true;
                s.faults_used[CRASH] += 1;
                // A crashed process's answers and pushes go nowhere.
                let dead = |w: u8| self.process_of[w as usize] == p;
                s.net.retain(|m| match m {
                    Msg::Answer { tok, .. } => !dead(tok.w),
                    Msg::Push { w } => !dead(*w),
                    Msg::Req { .. } => true,
                });
            }
            Action::Pause(p) => {
                s.procs[p as usize].paused = true;
                s.faults_used[PAUSE] += 1;
            }
            Action::Resume(p) => s.procs[p as usize].paused = false,
            Action::Restart => {
                s.server = Server {
                    keys: vec![Key::default(); self.keys as usize],
                    grants_this_tick: s.server.grants_this_tick,
                };
                s.epoch += 1;
                s.faults_used[RESTART] += 1;
            }
        }
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let n = self.processes();
        let slow = &self.slow_clocks;
        [0].into_iter()
            .map(|_| State {
                now: 0,
                server: Server::new(self.keys),
                epoch: 0,
                procs: (0..n)
                    .map(|i| Proc {
                        slow: slow[i],
                        crashed: false,
                        paused: false,
                    })
                    .collect(),
                waiters: (0..self.waiters())
                    .map(|_| Waiter {
                        phase: Phase::Idle,
                        tok: 0,
                        place: false,
                        pushed: false,
                        push_at: None,
                        left: self.acquisitions,
                        granted: 0,
                        gave_up: 0,
                        joined: 0,
                    })
                    .collect(),
                net: vec![],
                faults_used: [0; 5],
                max_fence: vec![0; self.keys as usize],
                joins: 0,
                broken: None,
                fresh: true,
            })
            .collect()
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        if s.now >= self.horizon {
            return;
        }
        // Timers that are due run at the tick (see `next_state`); what is left is chosen.
        let quiet = self.quiet(s.now);
        let mut local = vec![];
        for w in 0..self.waiters() {
            if !self.alive(s, w) {
                continue;
            }
            let wt = &s.waiters[w];
            let wb = w as u8;
            match wt.phase {
                // Before the quiet ticks, a start or a release comes at a tick's start: one
                // later in the tick is the same to the server (its request may be delayed),
                // and holds the key locally no longer than to the next tick.
                Phase::Idle if wt.left > 0 && (s.fresh || quiet) => local.push(Action::Start(wb)),
                Phase::Waiting { .. } if wt.pushed => local.push(Action::Recheck(wb)),
                _ => {}
            }
            match wt.phase {
                Phase::Waiting { .. }
                    if s.fresh && !quiet && s.faults_used[LEAVE] < self.faults.leave =>
                {
                    local.push(Action::GiveUp(wb))
                }
                // Once quiet, a holder keeps the key until its lease ends: the slowest fair
                // schedule, and the one in which a lease that outlives the server's shows.
                Phase::Held { end, .. } if s.now < end && s.fresh && !quiet => {
                    local.push(Action::Release(wb))
                }
                _ => {}
            }
        }
        if quiet {
            // No more faults: one fair schedule. Paused processes resume, waiters start and
            // answer pushes at once, the oldest message arrives, and the tick passes once
            // nothing is in flight.
            let next = s
                .procs
                .iter()
                .position(|p| p.paused && !p.crashed)
                .map(|p| Action::Resume(p as u8))
                .or(local.into_iter().next())
                .or(s.net.first().map(|m| Action::Deliver(m.clone())))
                .unwrap_or(Action::Tick);
            out.push(next);
            return;
        }
        out.push(Action::Tick);
        out.extend(local);
        for (i, m) in s.net.iter().enumerate() {
            if i > 0 && s.net[i - 1] == *m {
                continue;
            }
            out.push(Action::Deliver(m.clone()));
            // Faults come at a tick's start: a message lost then is one never delivered, and a
            // crash, pause or restart then is one between any two of the tick's steps, as far
            // as the messages in flight can tell.
            if s.fresh && s.faults_used[LOSS] < self.faults.loss {
                out.push(Action::Lose(m.clone()));
            }
        }
        for p in 0..s.procs.len() {
            let pr = &s.procs[p];
            if pr.crashed {
                continue;
            }
            if s.fresh && s.faults_used[CRASH] < self.faults.crash {
                out.push(Action::Crash(p as u8));
            }
            if pr.paused {
                out.push(Action::Resume(p as u8));
            } else if s.fresh && s.faults_used[PAUSE] < self.faults.pause {
                out.push(Action::Pause(p as u8));
            }
        }
        if s.fresh && s.faults_used[RESTART] < self.faults.restart {
            out.push(Action::Restart);
        }
    }

    fn next_state(&self, last: &State, a: Action) -> Option<State> {
        let mut s = last.clone();
        let fault = matches!(
            a,
            Action::Lose(_) | Action::Crash(_) | Action::Pause(_) | Action::Restart
        );
        let timers = matches!(a, Action::Tick | Action::Resume(_));
        self.apply(&mut s, a);
        s.fresh = fault || (s.fresh && timers);
        if timers {
            s.fresh = true;
            self.run_due(&mut s);
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("two holders never overlap", mutual_exclusion),
            Property::always("held means the server has it", held_on_server),
            Property::always("fences grow", |_, s: &State| {
                s.broken != Some(Broken::FenceDidNotGrow)
            }),
            Property::always("granted in the order first joined", |_, s: &State| {
                s.broken != Some(Broken::GrantedOutOfOrder)
            }),
            Property::always("every live waiter is granted", |p, s| {
                every_live_waiter_granted(p, s)
            }),
            // Reachability: the bound does reach a grant after a restart, a crash and a loss.
            Property::sometimes("a grant after a restart", |p: &Protocol, s: &State| {
                s.epoch > 0 && (0..p.waiters()).any(|w| s.held(w).is_some_and(|h| h.1 > 0))
            }),
        ]
    }
}

/// Two waiters of one key granted in the same server life never read `held` at one tick. (A
/// server that lost its data may grant a key twice: the documented durability exception.)
pub fn mutual_exclusion(p: &Protocol, s: &State) -> bool {
    let held: Vec<(usize, u8)> = (0..p.waiters())
        .filter_map(|w| s.held(w).map(|(_, e)| (w, e)))
        .collect();
    held.iter().enumerate().all(|(i, &(a, ea))| {
        held[i + 1..]
            .iter()
            .all(|&(b, eb)| p.key_of[a] != p.key_of[b] || ea != eb)
    })
}

/// A waiter that reads `held` has its token on the server, under a lease that has not ended,
/// unless the server lost it to a restart (then its local lease ends on its own: `held` is
/// read from the clock).
pub fn held_on_server(p: &Protocol, s: &State) -> bool {
    (0..p.waiters()).all(|w| match s.held(w) {
        Some((_, epoch)) if epoch == s.epoch => {
            let k = &s.server.keys[p.key_of[w] as usize];
            matches!(&k.val, Some((Val::Held { tok, .. }, exp))
                if *tok == s.tok(w) && *exp > s.now)
        }
        _ => true,
    })
}

/// At the horizon, every waiter whose process lives got every grant it asked for (and did not
/// give up).
pub fn every_live_waiter_granted(p: &Protocol, s: &State) -> bool {
    s.now < p.horizon
        || (0..p.waiters()).all(|w| {
            let wt = &s.waiters[w];
            s.procs[p.process_of[w] as usize].crashed || wt.granted + wt.gave_up == p.acquisitions
        })
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}
