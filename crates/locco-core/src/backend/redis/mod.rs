//! The Redis/Valkey backend, standalone or Cluster.
//!
//! Acquire is `SET key token NX PX ttl`; release, extend and `is_held` are compare-then-act Lua
//! scripts sent by EVALSHA, with EVAL when a restarted server has lost its script cache. The
//! connections and their I/O live on a small Tokio runtime of this crate's own; the engine
//! waits for answers on its thread through one-shot channels.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Client, RedisError, Script, Value};

use crate::backend::shared::io::{self, redact, runtime, Failure};
use crate::contract::value::holder_of;
use crate::contract::{extend_each, Backend, GivenUp, KeyInfo, Op, Queue, Queued, Renewal, Waiter};
use crate::rt::error::{BackendErrorKind, Error};

mod doctor;
#[cfg(unix)]
mod event_loop_link;
// Only an event-loop link (Unix) makes one.
mod failure;
mod gate;
// The health of a connection on the event loop, which only a link (Unix) makes.
#[cfg_attr(not(unix), allow(dead_code))]
mod health;
#[cfg_attr(not(unix), allow(dead_code))]
mod loop_conn;
mod pushes;
pub mod redlock;

use failure::failure_of;
use gate::{Gate, Priority};

/// What the queue scripts share. KEYS[1] the lock, KEYS[2] its queue (QUEUE: a list of
/// places, oldest first), KEYS[3] each place's deadline (PLACES: a sorted set, server ms). A place is
/// `<channel>|<waiter>`: the channel of the adapter that waits, so a push reaches only it.
///
/// Two marks in the lock's value keep the uncontended path as it is without a queue:
/// - A key held while someone waits carries its token and `|locco:waited`, so the holder's
///   release knows to look at the queue; a release without the mark is a plain
///   compare-and-delete.
/// - A key released while waiters wait is not deleted but reserved for the head (its value is
///   `locco:reserved|` and the head's place, for as long as the place lives): a plain
///   `SET NX`, the cheap path of every try and first attempt, then cannot take it past them.
const QUEUE_PRELUDE: &str = r"
local RESERVED = 'locco:reserved|'
local WAITED = '|locco:waited'
-- The queue and its deadlines; a release on a standalone server sends the lock's key alone
-- (see RELEASE_FAST).
local QUEUE = KEYS[2] or KEYS[1] .. ':locco-q'
local PLACES = KEYS[3] or KEYS[1] .. ':locco-qt'
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- The longest live place and its deadline, after dropping the places at the front whose
-- lease ran out.
local function head(now)
  while true do
    local h = redis.call('LINDEX', QUEUE, 0)
    if not h then return nil end
    local d = tonumber(redis.call('ZSCORE', PLACES, h) or '0')
    if d > now then return h, d end
    redis.call('LPOP', QUEUE)
    redis.call('ZREM', PLACES, h)
  end
end
local function wake(h)
  local chan = string.match(h, '^(.-)|')
  -- pcall: a user without channel rights still gets its locks; its waiters re-check instead.
  if chan then redis.pcall('PUBLISH', 'locco:wake:' .. chan, h) end
end
-- Keeps a free key for the head (told by a push) while its place lives.
local function reserve(h, d, now)
  redis.call('SET', KEYS[1], RESERVED .. h, 'PX', math.max(1, d - now))
  wake(h)
end
-- The key is ours no more: the head's, or nobody's.
local function hand_over()
  if redis.call('EXISTS', QUEUE) == 1 then
    local now = now_ms()
    local h, d = head(now)
    if h then return reserve(h, d, now) end
  end
  redis.call('DEL', KEYS[1])
end
";

/// A queued attempt, made after a plain `SET NX` missed. KEYS[4] the fencing counter (given
/// only when fenced). ARGV: token, ttl ms, our place, the place's lease ms, '1' to take a
/// fencing token, how long the counter outlives its last grant. Answers {1, fence or 0} for a
/// grant, else {0, ms until the holder's lease ends when we are at the head, or -1}.
const ACQUIRE_BODY: &str = r"
local me = ARGV[3]
local now = now_ms()
local h, d = head(now)
local v = redis.call('GET', KEYS[1])
-- A reservation for a place that is not the live head is left over: the key is free.
local free = v == false or (string.sub(v, 1, #RESERVED) == RESERVED and v ~= RESERVED .. (h or ''))
if (free or v == RESERVED .. me) and (h == nil or h == me) then
  local value = ARGV[1]
  if h then
    redis.call('LPOP', QUEUE)
    redis.call('ZREM', PLACES, h)
    if redis.call('LLEN', QUEUE) > 0 then value = value .. WAITED end
  end
  redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
  return grant()
end
-- Free, or reserved for a head that has not come (its push may be lost): tell it again.
if free then reserve(h, d, now) elseif h and v == RESERVED .. h then wake(h)
-- Held: its release must hand the key over.
elseif string.sub(v, 1, #RESERVED) ~= RESERVED and string.sub(v, -#WAITED) ~= WAITED then
  redis.call('SET', KEYS[1], v .. WAITED, 'KEEPTTL')
end
if not redis.call('ZSCORE', PLACES, me) then
  redis.call('RPUSH', QUEUE, me)
end
redis.call('ZADD', PLACES, now + tonumber(ARGV[4]), me)
-- The queue outlives every place in it, and goes when its last waiter does.
redis.call('PEXPIRE', QUEUE, ARGV[4])
redis.call('PEXPIRE', PLACES, ARGV[4])
if h == nil or h == me then
  return {0, redis.call('PTTL', KEYS[1])}
end
return {0, -1}";

/// The fencing token of a grant; the counter is KEYS[4], ARGV[5] and [6] as in the acquire
/// scripts.
const GRANT_FENCE: &str = r"
local function grant()
  if ARGV[5] ~= '1' then return {1, 0} end
  -- At least the server's time in microseconds: tokens keep growing even when the counter is
  -- lost to a restart without persistence, a flush or a failover. The counter breaks ties and
  -- covers a clock that steps back.
  local t = redis.call('TIME')
  local fence = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local last = tonumber(redis.call('GET', KEYS[4]) or '0')
  if last >= fence then fence = last + 1 end
  local keep = math.max(tonumber(ARGV[6]), tonumber(ARGV[2]))
  redis.call('SET', KEYS[4], string.format('%.0f', fence), 'PX', keep)
  return {1, fence}
end
";

/// A try, or a first attempt: the grant when the key is free, as without a queue (a reserved
/// key is not free). Same KEYS and ARGV as the queued attempt; only a fenced try runs it.
const TRY_FENCED: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return grant() end
return {0, -1}";

/// Deletes the key only when it still carries our token; with someone waiting (the prelude
/// comes between the two parts, defined only then), reserves it for the next waiter.
///
/// Every release runs it, so on a standalone server it is sent the lock's key alone, as
/// without a queue, and the queue's keys are named in the script (`<key>:locco-q…`, the
/// names `lock_keys` gives there). A standalone server does not need a script's keys declared;
/// a Cluster does (to route it), and gets all three.
const RELEASE_FAST: &str = r"
local v = redis.call('MGET', KEYS[1])[1]
if v == ARGV[1] then return redis.call('DEL', KEYS[1]) end
if v ~= ARGV[1] .. '|locco:waited' then return 0 end
";
const RELEASE_BODY: &str = r"
hand_over()
return 1";

/// Gives up our place (ARGV[1]). A key reserved for us, or left free by a holder whose lease
/// ran out, goes to the next waiter.
const LEAVE_BODY: &str = r"
redis.call('LREM', QUEUE, 0, ARGV[1])
redis.call('ZREM', PLACES, ARGV[1])
local v = redis.call('GET', KEYS[1])
if v == false or v == RESERVED .. ARGV[1] then hand_over() end
return 1";

/// A new lease for our own live key. An expired key is gone, so GET finds nothing and the key
/// is never re-created. The scripts that check a token read it with MGET, which finds nothing
/// in a key of another type where GET raises WRONGTYPE: such a key is not ours either.
const EXTEND: &str = r"
local v = redis.call('MGET', KEYS[1])[1]
if v == ARGV[1] or v == ARGV[1] .. '|locco:waited' then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0";

/// EXTEND for each key, all with one ttl: ARGV is the ttl, then a token per key. Answers a
/// string with one character per key, `1` (extended) or `0`: one reply value, not one each.
/// One MGET reads every value: a `redis.call` per key costs more than the GET itself. Every
/// key gets the same end, the server's time when the script started plus the ttl, through
/// PEXPIREAT: PEXPIRE reads the clock and rewrites itself into a PEXPIREAT for each key, a
/// tenth of the server's time at a million held locks. The start is after the request left,
/// so each lease still ends on the server no earlier than the holder counts it.
const EXTEND_MANY: &str = r"
local now = redis.call('TIME')
local at = string.format('%.0f', now[1] * 1000 + math.floor(now[2] / 1000) + tonumber(ARGV[1]))
local values = redis.call('MGET', unpack(KEYS))
local out = {}
for i = 1, #KEYS do
  local token, v = ARGV[i + 1], values[i]
  if v == token or v == token .. '|locco:waited' then
    redis.call('PEXPIREAT', KEYS[i], at)
    out[i] = '1'
  else
    out[i] = '0'
  end
end
return table.concat(out)";

/// How long the Cluster client waits before it sends a request again after TRYAGAIN (a slot
/// half moved), CLUSTERDOWN or LOADING, at least and at most (ms), and how many times it
/// sends one (redirects count too). The crate's own waits (1.28 s, doubling up to minutes)
/// outlast a lease's slack, and other requests stalled behind one waiting so: a held lock's
/// renewal was lost while a slot moved. 50 tries ride out some 5 s of a slot move or a
/// failover (16 gave up after 3 s, failing an acquisition that had the time to wait); the
/// engine's deadlines cut a request sooner.
const CLUSTER_RETRY_WAIT_MS: (u64, u64) = (10, 200);
const CLUSTER_TRIES: u32 = 50;

/// The most keys one EXTEND_MANY call takes.
const MAX_KEYS_PER_SCRIPT: usize = 1000;

/// Our token, with a lease still running.
const IS_HELD: &str = r"
local v = redis.call('MGET', KEYS[1])[1]
if (v == ARGV[1] or v == ARGV[1] .. '|locco:waited') and redis.call('PTTL', KEYS[1]) > 0 then
  return 1
end
return 0";

/// The ends of the names of the keys kept beside a lock (its queue, its places' deadlines, its
/// fencing counter; see `lock_keys`): never a lock, whatever they hold. `list` skips them and
/// the operator scripts refuse them (`lock_at_lua` is made from this list).
const SIDE_SUFFIXES: [&str; 3] = [":locco-q", ":locco-qt", ":locco-fence"];

/// The one test of "a lock this library wrote" that the operator verbs share (`inspect` and
/// `list` through INSPECT, `forceRelease` through FORCE_RELEASE_BODY), so what an operator is
/// shown and what a forced release removes cannot differ: a string key with a lease (a positive
/// PTTL) whose name is not a side key's. Answers its value and ms left, or nothing: a key that
/// is absent, of another type, without an expiry or beside a lock is no lock, and a key
/// reserved for a waiter has no holder.
///
/// An application's own string with an expiry passes: on Redis nothing else tells it apart
/// from a lock (a `token` function may return any text). Keep locks under their own key
/// prefix (the Locker's `keyPrefix`) when other data shares the database.
fn lock_at_lua() -> String {
    let sides: Vec<String> = SIDE_SUFFIXES.iter().map(|s| format!("'{s}'")).collect();
    format!(
        r"
local function lock_at(key)
  for _, side in ipairs({{{sides}}}) do
    if string.sub(key, -#side) == side then return nil end
  end
  if redis.call('TYPE', key).ok ~= 'string' then return nil end
  local ttl = redis.call('PTTL', key)
  if ttl <= 0 then return nil end
  local v = redis.call('GET', key)
  if v == '' or string.sub(v, 1, #'{RESERVED_PREFIX}') == '{RESERVED_PREFIX}' then return nil end
  return v, ttl
end
",
        sides = sides.join(", ")
    )
}

/// What an operator sees of a key: KEYS[1] the lock, KEYS[2] its fence counter. Answers
/// {value, ms left, last fence}: value '' for a key that is no lock (see `lock_at_lua`), and
/// fence '' for a key that never took a fencing token.
const INSPECT: &str = r"
local v, ttl = lock_at(KEYS[1])
local f = ''
if KEYS[2] and redis.call('TYPE', KEYS[2]).ok == 'string' then f = redis.call('GET', KEYS[2]) end
return {v or '', ttl or -2, f}";

/// Removes whoever holds the key, whatever its token: a held key goes to the head of its
/// queue (reserved and woken, as after a release) or is deleted. Anything `lock_at` does not
/// take for a lock is left as it is, a key reserved for a waiter too. ARGV[1], when given, is
/// the only value to remove (a Redlock removes the value a quorum agreed on). Answers the
/// value removed, '' for none. Same KEYS as a release on a Cluster.
const FORCE_RELEASE_BODY: &str = r"
local v = lock_at(KEYS[1])
if not v or (ARGV[1] and v ~= ARGV[1] and v ~= ARGV[1] .. WAITED) then return '' end
hand_over()
return v";

/// The value of a key reserved for the head of its queue, before the head's place (the
/// scripts' `RESERVED`).
const RESERVED_PREFIX: &str = "locco:reserved|";
/// After the token of a key held while someone waits (the scripts' `WAITED`).
const WAITED_SUFFIX: &str = "|locco:waited";

/// A fence counter lives this long after its key's last grant.
const FENCE_COUNTER_KEEP_MS: u64 = 24 * 60 * 60 * 1000;

/// A script, sent as EVALSHA. A server that does not know it yet (new, restarted, or a
/// replica just promoted) is sent the same call as an EVAL of its body, which also keeps it
/// there for the next EVALSHA. Not SCRIPT LOAD: on a Cluster that goes to every master, so an
/// operation on one key would wait for the slowest master of all (or fail with one that is
/// down).
struct Lua {
    script: Script,
    body: String,
}

impl Lua {
    fn new(body: String) -> Self {
        Lua {
            script: Script::new(&body),
            body,
        }
    }

    fn hash(&self) -> &str {
        self.script.get_hash()
    }

    /// The EVALSHA of this script with `keys` and `args`.
    fn evalsha<K: AsRef<str>, A: AsRef<str>>(&self, keys: &[K], args: &[A]) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.hash()).arg(keys.len());
        keys.iter().for_each(|k| {
            cmd.arg(k.as_ref());
        });
        args.iter().for_each(|a| {
            cmd.arg(a.as_ref());
        });
        cmd
    }

    /// `evalsha` (a call of this script) as an EVAL of its body.
    fn eval_of(&self, evalsha: &redis::Cmd) -> redis::Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(self.body.as_bytes());
        // The calls are built by `evalsha` (or by hand, the same way): plain arguments only.
        evalsha.args_iter().skip(2).for_each(|arg| {
            if let redis::Arg::Simple(bytes) = arg {
                cmd.arg(bytes);
            }
        });
        cmd
    }
}

/// Sends `evalsha`, a call of `lua`; on NOSCRIPT, the same call with the script's body.
async fn run_lua<T: redis::FromRedisValue, C: redis::aio::ConnectionLike>(
    conn: &mut C,
    lua: &Lua,
    evalsha: &redis::Cmd,
) -> Result<T, RedisError> {
    match evalsha.query_async(conn).await {
        Err(e) if unknown_script(&e) => lua.eval_of(evalsha).query_async(conn).await,
        answer => answer,
    }
}

/// NOSCRIPT: the server does not know the script (yet).
fn unknown_script(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

struct Scripts {
    acquire: Lua,
    try_fenced: Lua,
    release: Lua,
    leave: Lua,
    extend: Lua,
    extend_many: Lua,
    is_held: Lua,
    inspect: Lua,
    force_release: Lua,
}

fn scripts() -> &'static Scripts {
    static SCRIPTS: OnceLock<Scripts> = OnceLock::new();
    let queued = |body: &str| Lua::new(format!("{QUEUE_PRELUDE}{body}"));
    SCRIPTS.get_or_init(|| Scripts {
        acquire: queued(&format!("{GRANT_FENCE}{ACQUIRE_BODY}")),
        try_fenced: Lua::new(format!("{GRANT_FENCE}{TRY_FENCED}")),
        release: Lua::new(format!("{RELEASE_FAST}{QUEUE_PRELUDE}{RELEASE_BODY}")),
        leave: queued(LEAVE_BODY),
        extend: Lua::new(EXTEND.to_owned()),
        extend_many: Lua::new(EXTEND_MANY.to_owned()),
        is_held: Lua::new(IS_HELD.to_owned()),
        inspect: Lua::new(format!("{}{INSPECT}", lock_at_lua())),
        force_release: queued(&format!("{}{FORCE_RELEASE_BODY}", lock_at_lua())),
    })
}

/// `waitForReplicas`: a grant or extension counts only once this many replicas have it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WaitForReplicas {
    pub replicas: u32,
    pub timeout_ms: u64,
}

/// How to reach Redis.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// One URL (`redis://` or `rediss://`, user and password in it), or the seed nodes of a
    /// Cluster.
    pub urls: Vec<String>,
    pub cluster: bool,
    /// Milliseconds to establish a connection. Default 5000.
    pub connect_timeout_ms: u64,
    /// Milliseconds to wait for any one answer. Default 5000.
    pub command_timeout_ms: u64,
    pub wait_for_replicas: Option<WaitForReplicas>,
    /// PEM certificate(s) to trust for `rediss://`, instead of the system's roots.
    pub tls_ca: Option<Vec<u8>>,
}

impl RedisOptions {
    pub fn new(url: impl Into<String>) -> Self {
        RedisOptions {
            urls: vec![url.into()],
            cluster: false,
            connect_timeout_ms: 5000,
            command_timeout_ms: 5000,
            wait_for_replicas: None,
            tls_ca: None,
        }
    }
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    /// A connection on the engine's thread (see `event_loop_link`).
    Local(loop_conn::LoopConn),
    /// A connection of its own to one node (the doctor's, node by node).
    Node(MultiplexedConnection),
}

impl Conn {
    /// `SET key token NX PX ttl`: whether it set the key.
    async fn set_nx(&mut self, key: &str, token: &str, ttl: u32) -> Result<bool, RedisError> {
        if let Conn::Local(c) = self {
            let mut ttl_digits = itoa::Buffer::new();
            let args: [&[u8]; 6] = [
                b"SET",
                key.as_bytes(),
                token.as_bytes(),
                b"NX",
                b"PX",
                ttl_digits.format(ttl).as_bytes(),
            ];
            return Ok(match c.command(&args).await? {
                Value::Okay => true,
                Value::Nil => false,
                other => redis::from_redis_value::<Option<String>>(other)?.is_some(),
            });
        }
        let set: Option<String> = self.query(&set_nx(key, token, ttl)).await?;
        Ok(set.is_some())
    }

    async fn script<T: redis::FromRedisValue, K: AsRef<str>>(
        &mut self,
        lua: &Lua,
        keys: &[K],
        args: &[&str],
    ) -> Result<T, RedisError> {
        // On the event-loop link EVALSHA is encoded directly; a server that does not know the
        // script yet answers NOSCRIPT, and the call goes again below with the body.
        if let Conn::Local(c) = self {
            let numkeys = keys.len().to_string();
            let mut argv: Vec<&[u8]> = Vec::with_capacity(3 + keys.len() + args.len());
            argv.extend([&b"EVALSHA"[..], lua.hash().as_bytes(), numkeys.as_bytes()]);
            argv.extend(keys.iter().map(|k| k.as_ref().as_bytes()));
            argv.extend(args.iter().map(|a| a.as_bytes()));
            match c.command(&argv).await {
                Err(e) if unknown_script(&e) => {
                    return self.query(&lua.eval_of(&lua.evalsha(keys, args))).await;
                }
                answer => return Ok(redis::from_redis_value(answer?)?),
            }
        }
        self.evalsha(lua, &lua.evalsha(keys, args)).await
    }

    /// Sends `cmd`, an EVALSHA of `lua` (see [`run_lua`]).
    async fn evalsha<T: redis::FromRedisValue>(
        &mut self,
        lua: &Lua,
        cmd: &redis::Cmd,
    ) -> Result<T, RedisError> {
        match self {
            Conn::Single(c) => run_lua(c, lua, cmd).await,
            Conn::Cluster(c) => run_lua(c, lua, cmd).await,
            Conn::Local(c) => run_lua(c, lua, cmd).await,
            Conn::Node(c) => run_lua(c, lua, cmd).await,
        }
    }

    async fn grant(&mut self, request: &GrantRequest) -> Result<GrantReply, RedisError> {
        match self {
            Conn::Single(c) => request.send(c).await,
            Conn::Cluster(c) => request.send(c).await,
            Conn::Local(c) => request.send(c).await,
            Conn::Node(c) => request.send(c).await,
        }
    }

    async fn query<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> Result<T, RedisError> {
        match self {
            Conn::Single(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => cmd.query_async(c).await,
            Conn::Local(c) => cmd.query_async(c).await,
            Conn::Node(c) => cmd.query_async(c).await,
        }
    }
}

struct Inner {
    options: RedisOptions,
    /// Passwords of the URLs, removed from every message.
    secrets: Vec<String>,
    client: Option<Client>,
    conn: tokio::sync::Mutex<Option<Conn>>,
    closed: std::sync::atomic::AtomicBool,
    /// Connections for writes followed by WAIT, one per request in flight, so a WAIT holds up
    /// nobody else's commands.
    replicated: Mutex<Vec<MultiplexedConnection>>,
    warning: Mutex<Option<String>>,
    /// Set once a connection's eviction check has answered (or was refused), and once its
    /// warning went to the sink.
    eviction_checked: std::sync::atomic::AtomicBool,
    warned: std::sync::atomic::AtomicBool,
    /// Failed connection attempts so far, and the last one's failure: an operation that
    /// waited while an attempt failed takes that failure (see `conn`).
    connect_failures: std::sync::atomic::AtomicU64,
    connect_failed: Mutex<Option<Failure>>,
    /// This adapter's pub/sub channel (`locco:wake:<channel>`), and its subscriber.
    channel: String,
    pushes: pushes::Pushes,
}

/// A Redis or Valkey server, or a Redis Cluster.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
    /// Where a warning found at connect goes (see `on_warning`).
    warn: Option<std::rc::Rc<dyn Fn(String)>>,
    /// The connection on the engine's thread, when the host's event loop drives it.
    #[cfg(unix)]
    link: Option<std::rc::Rc<crate::backend::redis::event_loop_link::Link>>,
    /// Bounds the operations in flight on the connection, renewals first (see `gate`).
    gate: std::rc::Rc<Gate>,
}

fn secrets_of(urls: &[String]) -> Vec<String> {
    urls.iter()
        .filter_map(|u| {
            let rest = u.split_once("://")?.1;
            let userinfo = rest.split_once('@')?.0;
            let password = userinfo.split_once(':').map_or(userinfo, |(_, p)| p);
            (!password.is_empty()).then(|| password.to_string())
        })
        .flat_map(|p| {
            let decoded = percent_decode(&p);
            [p, decoded]
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The hash tag of a key (the part Redis Cluster hashes), when it has a valid one.
pub fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')? + open + 1;
    (close > open + 1).then(|| &key[open + 1..close])
}

/// The Cluster hash slot of a key: CRC16 (XMODEM) of its hash tag, or of the whole key.
fn slot_of(key: &str) -> u16 {
    let hashed = hash_tag(key).unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in hashed.as_bytes() {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// A key beside a lock's, in the same hash slot: `suffix` after the lock's key, which is
/// wrapped in a hash tag when it has none.
fn beside(key: &str, suffix: &str) -> String {
    if hash_tag(key).is_some() {
        suffixed(key, suffix)
    } else {
        format!("{{{key}}}:{suffix}")
    }
}

/// `<key>:<suffix>`, without the formatting machinery: it runs for every release.
fn suffixed(key: &str, suffix: &str) -> String {
    let mut s = String::with_capacity(key.len() + 1 + suffix.len());
    s.push_str(key);
    s.push(':');
    s.push_str(suffix);
    s
}

/// The key of a lock's fencing counter, in the same hash slot as the lock.
pub fn fence_key(key: &str) -> String {
    beside(key, "locco-fence")
}

/// The keys the scripts take: the lock, its queue, its places' deadlines, and its fence
/// counter when `fenced` (an ACL may not allow it). The queue's keys start with the lock's key
/// where they can (not on a Cluster, where a key without a hash tag needs one), so ACL key
/// patterns that allow the lock allow its queue.
fn lock_keys(key: &str, cluster: bool, fenced: bool) -> Vec<String> {
    let queue = |suffix: &str| match cluster {
        true => beside(key, suffix),
        false => suffixed(key, suffix),
    };
    let mut keys = Vec::with_capacity(4);
    keys.extend([key.to_owned(), queue("locco-q"), queue("locco-qt")]);
    if fenced {
        keys.push(fence_key(key));
    }
    keys
}

impl RedisBackend {
    /// Checks the options; connects on first use, so construction never blocks.
    pub fn new(options: RedisOptions) -> Result<Self, Error> {
        if options.urls.is_empty() {
            return Err(Error::validation("url", "give url, or urls for a Cluster"));
        }
        if options.urls.len() > 1 && !options.cluster {
            return Err(Error::validation("urls", "several URLs need cluster: true"));
        }
        if options.cluster && options.wait_for_replicas.is_some() {
            return Err(Error::validation(
                "waitForReplicas",
                "is not supported on a Cluster: WAIT must run on the connection that wrote, \
                 which a Cluster client does not guarantee",
            ));
        }
        if let Some(w) = options.wait_for_replicas {
            if w.replicas == 0 || w.timeout_ms == 0 {
                return Err(Error::validation(
                    "waitForReplicas",
                    "needs replicas >= 1 and a timeout >= 1 ms",
                ));
            }
        }
        let secrets = secrets_of(&options.urls);
        let redact = |m: String| redact(&secrets, m);
        let client = if options.cluster {
            None
        } else {
            let built = match &options.tls_ca {
                Some(ca) => Client::build_with_tls(
                    options.urls[0].as_str(),
                    redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(ca.clone()),
                    },
                ),
                None => Client::open(options.urls[0].as_str()),
            };
            Some(built.map_err(|e| Error::validation("url", redact(e.to_string())))?)
        };
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                options,
                secrets,
                client,
                conn: tokio::sync::Mutex::new(None),
                closed: Default::default(),
                replicated: Mutex::default(),
                warning: Mutex::default(),
                eviction_checked: Default::default(),
                warned: Default::default(),
                connect_failures: Default::default(),
                connect_failed: Mutex::default(),
                channel: crate::rt::ids::random_token()[..16].to_owned(),
                pushes: Default::default(),
            }),
            warn: None,
            #[cfg(unix)]
            link: None,
            gate: Gate::new(gate::DEFAULT_IN_FLIGHT),
        })
    }

    /// Sends a warning found at connect (an eviction policy that can drop lock keys) to
    /// `sink`, on this thread, before any answer that used the connection is returned: so the
    /// host hears of it before its first grant.
    pub fn on_warning(&mut self, sink: std::rc::Rc<dyn Fn(String)>) {
        self.warn = Some(sink);
    }

    /// Does the I/O of a plain-TCP standalone server on the engine's thread, driven by
    /// `host`. TLS, a Cluster and `waitForReplicas` stay on the I/O thread.
    #[cfg(unix)]
    pub fn on_event_loop(&mut self, host: std::rc::Rc<dyn crate::rt::event_loop::EventLoop>) {
        let o = &self.inner.options;
        let Some(client) = &self.inner.client else {
            return;
        };
        if o.wait_for_replicas.is_some() {
            return;
        }
        self.link = crate::backend::redis::event_loop_link::Link::new(
            host,
            client.get_connection_info().clone(),
            self.inner.secrets.clone(),
            o.connect_timeout_ms,
            o.command_timeout_ms,
        );
    }

    /// Connects now rather than on first use. Answers a warning found at connect (an
    /// eviction policy that can drop lock keys), once.
    pub fn connect(&self) -> Op<Option<String>> {
        // With a sink, the warning goes there (see `on_warning`), not in this answer.
        let to_sink = self.warn.is_some();
        self.with_conn(move |inner, _| async move {
            if to_sink {
                return Ok(None);
            }
            Ok(inner.warning.lock().ok().and_then(|mut w| w.take()))
        })
    }

    /// Drops the connections; operations after this fail.
    pub fn close(&self) {
        use std::sync::atomic::Ordering;
        self.inner.closed.store(true, Ordering::Release);
        self.inner.pushes.close();
        self.inner.replicated.lock().map(|mut r| r.clear()).ok();
        #[cfg(unix)]
        if let Some(link) = &self.link {
            link.close();
        }
        let inner = self.inner.clone();
        runtime().spawn(async move { inner.conn.lock().await.take() });
    }

    fn run<T: Send + 'static, F>(&self, work: impl FnOnce(Arc<Inner>) -> F) -> Op<T>
    where
        F: std::future::Future<Output = Result<T, Failure>> + Send + 'static,
    {
        let inner = self.inner.clone();
        io::run("redis", move |_| work(inner))
    }

    /// Runs `work` with the connection once the gate lets it in: on this thread when the
    /// event loop drives it, otherwise on the I/O thread.
    fn with_conn<T: Send + 'static, F>(
        &self,
        work: impl FnOnce(Arc<Inner>, Conn) -> F + Send + 'static,
    ) -> Op<T>
    where
        F: std::future::Future<Output = Result<T, Failure>> + Send + 'static,
    {
        self.with_conn_as(Priority::Other, None, work)
    }

    /// `with_conn` for a grant: one the caller gives up before it has left is not sent (see
    /// [`GivenUp`]).
    fn grant_with_conn<T: Send + 'static, F>(
        &self,
        work: impl FnOnce(Arc<Inner>, Conn) -> F + Send + 'static,
    ) -> Op<T>
    where
        F: std::future::Future<Output = Result<T, Failure>> + Send + 'static,
    {
        let given_up = GivenUp::default();
        self.with_conn_as(Priority::Other, Some(given_up.clone()), work)
            .given_up_by(given_up)
    }

    /// [`Self::with_conn`], waiting in `priority`'s queue while the connection is full.
    fn with_conn_as<T: Send + 'static, F>(
        &self,
        priority: Priority,
        given_up: Option<GivenUp>,
        work: impl FnOnce(Arc<Inner>, Conn) -> F + Send + 'static,
    ) -> Op<T>
    where
        F: std::future::Future<Output = Result<T, Failure>> + Send + 'static,
    {
        let inner = self.inner.clone();
        let warn = self.warn.clone();
        let gate = self.gate.clone();
        let given_up = move || given_up.as_ref().is_some_and(GivenUp::get);
        #[cfg(unix)]
        if let Some(link) = self.link.clone() {
            return Op::pending(async move {
                inner.check_open().map_err(Failure::into_error)?;
                let _room = gate.enter(priority).await;
                let lent = link.lend().await?;
                let mut conn = Conn::Local(lent.conn.clone());
                // Every operation checks until one check has answered, not only the first user
                // of a connection: an operation must not answer before the warning is known.
                let unchecked = !inner.eviction_checked.load(Ordering::Acquire);
                if lent.first_use() || unchecked {
                    inner.check_eviction(&mut conn).await;
                }
                if given_up() {
                    return Err(io::not_sent("redis").into_error());
                }
                let answer = work(inner.clone(), conn).await;
                inner.deliver_warning(warn.as_deref());
                answer.map_err(|f| link.failed(&lent, f).into_error())
            });
        }
        Op::pending(async move {
            let _room = gate.enter(priority).await;
            let answer = io::run("redis", {
                let inner = inner.clone();
                move |_| async move {
                    let conn = inner.conn().await?;
                    if given_up() {
                        return Err(io::not_sent("redis"));
                    }
                    work(inner, conn).await
                }
            })
            .await;
            inner.deliver_warning(warn.as_deref());
            answer
        })
    }
}

impl Inner {
    fn failure(&self, e: RedisError) -> Failure {
        failure_of(&self.secrets, e)
    }

    fn timeout_failure(&self, what: &str, ms: u64) -> Failure {
        let message = format!("{what} did not finish within {ms} ms");
        Failure::new("redis", BackendErrorKind::Timeout, message)
    }

    async fn connect(self: &Arc<Self>) -> Result<Conn, Failure> {
        let o = &self.options;
        let connect_timeout = Duration::from_millis(o.connect_timeout_ms);
        let response_timeout = Duration::from_millis(o.command_timeout_ms);
        let attempt = async {
            if o.cluster {
                let mut builder = ClusterClientBuilder::new(o.urls.clone())
                    .connection_timeout(connect_timeout)
                    .response_timeout(response_timeout)
                    .min_retry_wait(CLUSTER_RETRY_WAIT_MS.0)
                    .max_retry_wait(CLUSTER_RETRY_WAIT_MS.1)
                    .retries(CLUSTER_TRIES);
                if let Some(ca) = &o.tls_ca {
                    builder = builder.certs(redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(ca.clone()),
                    });
                }
                let client = builder.build()?;
                Ok(Conn::Cluster(client.get_async_connection().await?))
            } else {
                let client = self
                    .client
                    .clone()
                    .expect("a standalone backend has a client");
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    .set_response_timeout(Some(response_timeout))
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_millis(500));
                Ok(Conn::Single(
                    ConnectionManager::new_with_config(client, config).await?,
                ))
            }
        };
        let mut conn = match tokio::time::timeout(connect_timeout, attempt).await {
            Ok(r) => r.map_err(|e| self.failure(e))?,
            Err(_) => return Err(self.timeout_failure("connecting to Redis", o.connect_timeout_ms)),
        };
        self.check_eviction(&mut conn).await;
        Ok(conn)
    }

    /// Hands a warning found at connect to `sink`, once for the adapter's life (several
    /// operations may each have found it while the first check was in flight).
    fn deliver_warning(&self, sink: Option<&dyn Fn(String)>) {
        let Some(sink) = sink else { return };
        if let Some(text) = self.warning.lock().ok().and_then(|mut w| w.take()) {
            if !self.warned.swap(true, std::sync::atomic::Ordering::AcqRel) {
                sink(text);
            }
        }
    }

    /// Warns once when the server may evict lock keys under memory pressure. A CONFIG GET that
    /// ACLs deny is ignored.
    async fn check_eviction(&self, conn: &mut Conn) {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg("maxmemory-policy");
        if let Ok(reply) = conn.query::<Vec<String>>(&cmd).await {
            if let Some(policy) = reply.get(1).filter(|p| p.as_str() != "noeviction") {
                let text = format!(
                    "locco-rs: Redis maxmemory-policy is '{policy}': under memory pressure the \
                     server may evict lock keys, and two holders could then own one key. Run the \
                     lock Redis with maxmemory-policy noeviction."
                );
                if let Ok(mut w) = self.warning.lock() {
                    *w = Some(text);
                }
            }
        }
        self.eviction_checked
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Where the push subscriber may connect: the server, or each seed of a Cluster.
    fn pubsub_clients(&self) -> Vec<Client> {
        if let Some(client) = &self.client {
            return vec![client.clone()];
        }
        let open = |url: &String| match &self.options.tls_ca {
            Some(ca) => Client::build_with_tls(
                url.as_str(),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(ca.clone()),
                },
            ),
            None => Client::open(url.as_str()),
        };
        self.options
            .urls
            .iter()
            .filter_map(|u| open(u).ok())
            .collect()
    }

    fn check_open(&self) -> Result<(), Failure> {
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            let closed = "the Redis adapter is closed";
            return Err(Failure::new("redis", BackendErrorKind::Config, closed));
        }
        Ok(())
    }

    async fn conn(self: &Arc<Self>) -> Result<Conn, Failure> {
        use std::sync::atomic::Ordering;
        self.check_open()?;
        let failures_before = self.connect_failures.load(Ordering::Acquire);
        let mut slot = self.conn.lock().await;
        if let Some(c) = &*slot {
            return Ok(c.clone());
        }
        // An attempt that failed while this operation waited for the slot is its answer too:
        // trying again at once would make every queued operation pay a whole connect (a TLS
        // error would come twice as late, past a short lease). A later operation tries anew.
        if self.connect_failures.load(Ordering::Acquire) != failures_before {
            if let Some(failure) = self.connect_failed.lock().ok().and_then(|f| f.clone()) {
                return Err(failure);
            }
        }
        match self.connect().await {
            Ok(conn) => {
                *slot = Some(conn.clone());
                Ok(conn)
            }
            Err(failure) => {
                if let Ok(mut f) = self.connect_failed.lock() {
                    *f = Some(failure.clone());
                }
                self.connect_failures.fetch_add(1, Ordering::AcqRel);
                Err(failure)
            }
        }
    }

    /// A connection of its own for a write followed by WAIT.
    async fn replicated_conn(&self) -> Result<MultiplexedConnection, Failure> {
        if let Some(c) = self.replicated.lock().ok().and_then(|mut p| p.pop()) {
            return Ok(c);
        }
        let client = self.client.as_ref().expect("WAIT is refused on a Cluster");
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(self.options.connect_timeout_ms)))
            .set_response_timeout(Some(Duration::from_millis(self.options.command_timeout_ms)));
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| self.failure(e))
    }

    /// Gives a connection of [`Self::replicated_conn`] back for the next write.
    fn reuse_replicated(&self, conn: MultiplexedConnection) {
        if let Ok(mut pool) = self.replicated.lock() {
            pool.push(conn);
        }
    }

    /// Runs `write` on a connection of its own, then WAIT on that same connection; fewer
    /// acknowledgements than asked is a replication failure.
    async fn write_and_wait<T: redis::FromRedisValue>(
        self: &Arc<Self>,
        w: WaitForReplicas,
        given_up: Option<&GivenUp>,
        write: impl FnOnce(
            &mut MultiplexedConnection,
        ) -> futures_util::future::BoxFuture<'_, Result<T, RedisError>>,
    ) -> Result<(T, u32), Failure> {
        let mut conn = self.replicated_conn().await?;
        if given_up.is_some_and(GivenUp::get) {
            self.reuse_replicated(conn);
            return Err(io::not_sent("redis"));
        }
        let answer = write(&mut conn).await.map_err(|e| self.failure(e))?;
        let mut wait = redis::cmd("WAIT");
        wait.arg(w.replicas).arg(w.timeout_ms);
        let acked: i64 = wait
            .query_async(&mut conn)
            .await
            .map_err(|e| self.failure(e))?;
        self.reuse_replicated(conn);
        Ok((answer, acked.max(0) as u32))
    }

    fn replication_failure(w: WaitForReplicas, acknowledged: u32) -> Failure {
        let message = format!(
            "only {acknowledged} of {} replicas acknowledged within {} ms",
            w.replicas, w.timeout_ms
        );
        Failure {
            replication: Some((w.replicas, acknowledged)),
            ..Failure::new("redis", BackendErrorKind::Other, message)
        }
    }

    async fn give_back(self: &Arc<Self>, key: &str, token: &str) {
        if let Ok(mut conn) = self.conn().await {
            let keys = lock_keys(key, self.options.cluster, false);
            let _ = conn
                .script::<i64, _>(&scripts().release, &keys, &[token])
                .await;
        }
    }
}

/// The answer of the acquire script: granted, and the fence or the wait hint.
type GrantReply = (i64, i64);

/// A place in a key's queue never lives shorter than this, whatever the engine asks.
const MIN_PLACE_LEASE_MS: u32 = 100;

impl crate::contract::Coordination for RedisBackend {
    fn peek(&self, key: &str) -> Op<Option<String>> {
        // A key reserved for a waiter has no holder yet; the holder's token is before the mark.
        let value = self.get(key);
        Op::pending(async move {
            let value = value.await?;
            Ok(value.filter(|v| !v.starts_with(RESERVED_PREFIX)).map(|v| {
                match v.strip_suffix(WAITED_SUFFIX) {
                    Some(token) => token.to_owned(),
                    None => v,
                }
            }))
        })
    }

    fn put(&self, key: &str, value: &str, ttl: u32) -> Op<()> {
        let mut cmd = redis::cmd("SET");
        cmd.arg(key).arg(value).arg("PX").arg(ttl);
        self.with_conn(move |inner, mut conn| async move {
            conn.query::<()>(&cmd).await.map_err(|e| inner.failure(e))
        })
    }

    fn get(&self, key: &str) -> Op<Option<String>> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(key);
        self.with_conn(move |inner, mut conn| async move {
            conn.query::<Option<String>>(&cmd)
                .await
                .map_err(|e| inner.failure(e))
        })
    }

    fn delete(&self, key: &str) -> Op<()> {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(key);
        self.with_conn(move |inner, mut conn| async move {
            conn.query::<()>(&cmd).await.map_err(|e| inner.failure(e))
        })
    }
}

impl Backend for RedisBackend {
    fn name(&self) -> &str {
        "redis"
    }

    fn coordination(&self) -> Option<&dyn crate::contract::Coordination> {
        Some(self)
    }

    fn acquire(&self, key: &str, token: &str, ttl: u32) -> Op<bool> {
        if self.inner.options.wait_for_replicas.is_some() {
            return self.grant(key, token, ttl, "", false, |(granted, _)| granted == 1);
        }
        // The path of every uncontended lock: one command, straight to the connection.
        if let Err(e) = self.check_key(key) {
            return Op::ready(Err(e));
        }
        let (key, token) = (key.to_owned(), token.to_owned());
        self.grant_with_conn(move |inner, mut conn| async move {
            conn.set_nx(&key, &token, ttl)
                .await
                .map_err(|e| inner.failure(e))
        })
    }

    fn release(&self, key: &str, token: &str) -> Op<bool> {
        // The lock's key alone where the server allows it (see RELEASE_FAST).
        let keys = match self.inner.options.cluster {
            true => self.keys(key, false),
            false => vec![key.to_owned()],
        };
        let token = token.to_owned();
        self.with_conn(move |inner, mut conn| async move {
            let deleted: i64 = conn
                .script(&scripts().release, &keys, &[&token])
                .await
                .map_err(|e| inner.failure(e))?;
            Ok(deleted == 1)
        })
    }

    fn extend(&self, key: &str, token: &str, ttl: u32) -> Op<bool> {
        let (key, token) = (key.to_owned(), token.to_owned());
        let ttl = ttl.to_string();
        let Some(w) = self.inner.options.wait_for_replicas else {
            return self.with_conn_as(Priority::Renewal, None, move |inner, mut conn| async move {
                let done: i64 = conn
                    .script(&scripts().extend, &[&key], &[&token, &ttl])
                    .await
                    .map_err(|e| inner.failure(e))?;
                Ok(done == 1)
            });
        };
        self.run(move |inner| async move {
            let (done, acked) = inner
                .write_and_wait(w, None, |c| {
                    Box::pin(async move {
                        let extend = &scripts().extend;
                        run_lua::<i64, _>(c, extend, &extend.evalsha(&[&key], &[&token, &ttl]))
                            .await
                    })
                })
                .await?;
            if done == 1 && acked < w.replicas {
                return Err(Inner::replication_failure(w, acked));
            }
            Ok(done == 1)
        })
    }

    fn extend_many(&self, renewals: &[Renewal<'_>]) -> Op<Vec<Result<bool, Error>>> {
        // With waitForReplicas each extension waits for its own acknowledgements.
        if self.inner.options.wait_for_replicas.is_some() || renewals.len() < 2 {
            return extend_each(self, renewals);
        }
        // One script call per ttl (they differ only for locks clamped to their deadline) and,
        // on a Cluster, per hash slot. Built as one EVALSHA command: its arguments go into one
        // buffer, not an allocation each.
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut by_group: std::collections::HashMap<(u16, u32), usize> = Default::default();
        let cluster = self.inner.options.cluster;
        for (i, r) in renewals.iter().enumerate() {
            let slot = if cluster { slot_of(r.key) } else { 0 };
            let at = *by_group.entry((slot, r.ttl)).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[at].push(i);
            // The script unpacks its keys onto Lua's stack, which holds about 8,000.
            if groups[at].len() == MAX_KEYS_PER_SCRIPT {
                by_group.remove(&(slot, r.ttl));
            }
        }
        let script = &scripts().extend_many;
        let calls: Vec<(Vec<usize>, redis::Cmd)> = groups
            .into_iter()
            .map(|index| {
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(script.hash()).arg(index.len());
                index.iter().for_each(|&i| {
                    cmd.arg(renewals[i].key);
                });
                cmd.arg(renewals[index[0]].ttl);
                index.iter().for_each(|&i| {
                    cmd.arg(renewals[i].token);
                });
                (index, cmd)
            })
            .collect();
        let count = renewals.len();
        let op = self.with_conn_as(Priority::Renewal, None, move |inner, conn| async move {
            let sends = calls.into_iter().map(|(index, cmd)| {
                let mut conn = conn.clone();
                async move { (index, conn.evalsha::<Vec<u8>>(script, &cmd).await) }
            });
            let mut out: Vec<Result<bool, Failure>> = vec![Ok(false); count];
            for (index, answer) in futures_util::future::join_all(sends).await {
                match answer {
                    Ok(done) if done.len() == index.len() => {
                        index
                            .iter()
                            .zip(done)
                            .for_each(|(&i, d)| out[i] = Ok(d == b'1'));
                    }
                    Ok(done) => {
                        let message = format!(
                            "EXTEND_MANY answered {} outcomes for {} keys",
                            done.len(),
                            index.len()
                        );
                        let failure = Failure::new("redis", BackendErrorKind::Protocol, message);
                        index.iter().for_each(|&i| out[i] = Err(failure.clone()));
                    }
                    Err(e) => {
                        let failure = inner.failure(e);
                        index.iter().for_each(|&i| out[i] = Err(failure.clone()));
                    }
                }
            }
            Ok(out)
        });
        Op::pending(async move {
            let out = op.await?;
            Ok(out
                .into_iter()
                .map(|r| r.map_err(Failure::into_error))
                .collect())
        })
    }

    fn is_held(&self, key: &str, token: &str) -> Op<bool> {
        let (key, token) = (key.to_owned(), token.to_owned());
        self.with_conn(move |inner, mut conn| async move {
            let held: i64 = conn
                .script(&scripts().is_held, &[&key], &[&token])
                .await
                .map_err(|e| inner.failure(e))?;
            Ok(held == 1)
        })
    }

    fn supports_fencing(&self) -> bool {
        true
    }

    fn acquire_fenced(&self, key: &str, token: &str, ttl: u32) -> Op<Option<u64>> {
        self.grant(key, token, ttl, "", true, |(granted, fence)| {
            (granted == 1).then_some(fence as u64)
        })
    }

    fn queue(&self) -> Option<&dyn Queue> {
        Some(self)
    }

    fn inspect(&self, key: &str) -> Op<KeyInfo> {
        let seen = self.seen(key);
        Op::pending(async move { Ok(seen.await?.info) })
    }

    fn list(&self, prefix: &str, limit: u32) -> Op<Vec<KeyInfo>> {
        let seen = self.seen_under(prefix, limit);
        Op::pending(async move { Ok(seen.await?.into_iter().map(|s| s.info).collect()) })
    }

    fn force_release(&self, key: &str) -> Op<bool> {
        let removed = self.force_release_value(key, None);
        Op::pending(async move { Ok(removed.await?.is_some()) })
    }
}

/// A key as an operator is shown it, and the value of the lock it carries (the token and
/// label, without the queue's mark), by which a Redlock tells which servers agree.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub info: KeyInfo,
    pub value: Option<String>,
}

impl RedisBackend {
    /// What `inspect` shows, with the lock's value.
    pub(crate) fn seen(&self, key: &str) -> Op<Seen> {
        let key = key.to_owned();
        self.with_conn(
            move |inner, mut conn| async move { inspect_key(&inner, &mut conn, key).await },
        )
    }

    /// What `list` shows, with each lock's value: SCAN MATCH over the keys (on a Cluster, over
    /// each master), then one inspection per key found; the side keys are skipped.
    pub(crate) fn seen_under(&self, prefix: &str, limit: u32) -> Op<Vec<Seen>> {
        let pattern = format!("{}*", glob_escape(prefix));
        let cluster = self.inner.options.cluster;
        self.with_conn(move |inner, mut conn| async move {
            let keys = scan_keys(&inner, &mut conn, &pattern, cluster).await?;
            let candidates: Vec<String> = keys
                .into_iter()
                .filter(|k| !SIDE_SUFFIXES.iter().any(|s| k.ends_with(s)))
                .collect();
            // The reads of a chunk go out together, pipelined on the connection.
            let mut found = Vec::new();
            for chunk in candidates.chunks(256) {
                let reads = chunk.iter().map(|key| {
                    let (inner, mut conn, key) = (inner.clone(), conn.clone(), key.clone());
                    async move { inspect_key(&inner, &mut conn, key).await }
                });
                for seen in futures_util::future::join_all(reads).await {
                    let seen = seen?;
                    if seen.info.held {
                        found.push(seen);
                    }
                }
                if found.len() >= limit as usize {
                    break;
                }
            }
            found.sort_by(|a, b| a.info.key.cmp(&b.info.key));
            found.truncate(limit as usize);
            Ok(found)
        })
    }

    /// Releases the lock on `key` by force (see FORCE_RELEASE_BODY), only when its value is
    /// `only` if that is given; answers the value removed.
    pub(crate) fn force_release_value(&self, key: &str, only: Option<&str>) -> Op<Option<String>> {
        if let Err(e) = self.check_key(key) {
            return Op::ready(Err(e));
        }
        let keys = self.keys(key, false);
        let args: Vec<String> = only.map(str::to_owned).into_iter().collect();
        self.with_conn(move |inner, mut conn| async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let removed: String = conn
                .script(&scripts().force_release, &keys, &args)
                .await
                .map_err(|e| inner.failure(e))?;
            Ok((!removed.is_empty()).then_some(removed))
        })
    }
}

/// `*`, `?`, `[`, `]` and `\\` taken literally in a SCAN MATCH pattern.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

async fn inspect_key(inner: &Inner, conn: &mut Conn, key: String) -> Result<Seen, Failure> {
    // On a Cluster, a key with '}' but no hash tag has no fence counter in its slot (it could
    // never be fenced): its lock alone is read.
    let fenceless = inner.options.cluster && hash_tag(&key).is_none() && key.contains('}');
    let mut keys = vec![key.clone()];
    if !fenceless {
        keys.push(fence_key(&key));
    }
    let (value, ttl, fence): (String, i64, String) = conn
        .script(&scripts().inspect, &keys, &[])
        .await
        .map_err(|e| inner.failure(e))?;
    // The script answers a value only for a lock (see `lock_at_lua`).
    let held = !value.is_empty();
    let info = KeyInfo {
        key,
        held,
        ttl_left: held.then_some(ttl as f64),
        fence: fence.parse::<u64>().ok(),
        holder: held.then(|| holder_of(&value)).flatten(),
    };
    let value = held.then(|| match value.strip_suffix(WAITED_SUFFIX) {
        Some(v) => v.to_owned(),
        None => value,
    });
    Ok(Seen { info, value })
}

/// Every key matching `pattern`: one SCAN walk, on a Cluster one per master.
async fn scan_keys(
    inner: &Inner,
    conn: &mut Conn,
    pattern: &str,
    cluster: bool,
) -> Result<Vec<String>, Failure> {
    use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};
    let scan = |cursor: &str| {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000);
        cmd
    };
    let mut keys = Vec::new();
    let Conn::Cluster(c) = conn else {
        let mut cursor = "0".to_owned();
        loop {
            let (next, batch): (String, Vec<String>) = conn
                .query(&scan(&cursor))
                .await
                .map_err(|e| inner.failure(e))?;
            keys.extend(batch);
            if next == "0" {
                return Ok(keys);
            }
            cursor = next;
        }
    };
    debug_assert!(cluster);
    // The first page from every master at once (answered per node address), then each
    // master's walk on its own.
    let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
    let first = c
        .route_command(scan("0"), all)
        .await
        .map_err(|e| inner.failure(e))?;
    let per_node: Vec<(String, (String, Vec<String>))> =
        redis::from_redis_value(first).map_err(|e| inner.failure(e.into()))?;
    for (addr, (mut cursor, batch)) in per_node {
        keys.extend(batch);
        let (host, port) = addr.rsplit_once(':').unwrap_or((&addr, "6379"));
        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
            host: host.to_owned(),
            port: port.parse().unwrap_or(6379),
        });
        while cursor != "0" {
            let page = c
                .route_command(scan(&cursor), route.clone())
                .await
                .map_err(|e| inner.failure(e))?;
            let (next, batch): (String, Vec<String>) =
                redis::from_redis_value(page).map_err(|e| inner.failure(e.into()))?;
            keys.extend(batch);
            cursor = next;
        }
    }
    Ok(keys)
}

impl Queue for RedisBackend {
    fn acquire_queued(
        &self,
        key: &str,
        token: &str,
        ttl: u32,
        waiter: &str,
        lease: u32,
        fenced: bool,
    ) -> Op<Queued> {
        let inner = &self.inner;
        let channel = || format!("locco:wake:{}", inner.channel);
        inner.pushes.start(|| inner.pubsub_clients(), channel);
        let place = self.place(waiter);
        let lease = lease.max(MIN_PLACE_LEASE_MS);
        self.grant_as(
            key,
            token,
            ttl,
            place,
            lease,
            fenced,
            move |(granted, n)| match granted {
                1 => Queued::Granted(fenced.then_some(n as u64)),
                _ => Queued::Waiting {
                    retry_in: (n >= 0).then_some(n as f64),
                },
            },
        )
    }

    fn leave(&self, key: &str, waiter: &str) -> Op<()> {
        if let Err(e) = self.check_key(key) {
            return Op::ready(Err(e));
        }
        let (keys, place) = (self.keys(key, false), self.place(waiter));
        self.with_conn(move |inner, mut conn| async move {
            conn.script::<i64, _>(&scripts().leave, &keys, &[&place])
                .await
                .map(drop)
                .map_err(|e| inner.failure(e))
        })
    }

    fn wakeups(&self, _key: &str, waiter: &str) -> Box<dyn Waiter> {
        self.inner.pushes.listen(waiter)
    }
}

impl RedisBackend {
    fn keys(&self, key: &str, fenced: bool) -> Vec<String> {
        lock_keys(key, self.inner.options.cluster, fenced)
    }

    /// Our place in a queue: this adapter's channel and the waiter.
    fn place(&self, waiter: &str) -> String {
        format!("{}|{waiter}", self.inner.channel)
    }

    /// On a Cluster, a key's queue and counter must share its slot: a key with `}` but no
    /// hash tag cannot have them.
    fn check_key(&self, key: &str) -> Result<(), Error> {
        if self.inner.options.cluster && hash_tag(key).is_none() && key.contains('}') {
            return Err(Error::validation(
                "key",
                format!(
                    "{key:?} contains '}}' without a hash tag, so its queue and fencing counter \
                     cannot share its Cluster slot; give the key a hash tag such as {{order:1}}"
                ),
            ));
        }
        Ok(())
    }

    /// A try (no place): never queues, never takes a key promised to a waiter.
    fn grant<T: Send + 'static>(
        &self,
        key: &str,
        token: &str,
        ttl: u32,
        place: &str,
        fenced: bool,
        answer: impl FnOnce(GrantReply) -> T + Send + 'static,
    ) -> Op<T> {
        self.grant_as(key, token, ttl, place.to_owned(), 0, fenced, answer)
    }

    /// Sends one grant request; with `waitForReplicas`, a grant counts only once replicated.
    #[allow(clippy::too_many_arguments)]
    fn grant_as<T: Send + 'static>(
        &self,
        key: &str,
        token: &str,
        ttl: u32,
        place: String,
        lease: u32,
        fenced: bool,
        answer: impl FnOnce(GrantReply) -> T + Send + 'static,
    ) -> Op<T> {
        if let Err(e) = self.check_key(key) {
            return Op::ready(Err(e));
        }
        let request = match place.is_empty() && !fenced {
            true => GrantRequest::SetNx(set_nx(key, token, ttl)),
            false => GrantRequest::script(self.keys(key, fenced), token, ttl, place, lease, fenced),
        };
        let Some(w) = self.inner.options.wait_for_replicas else {
            return self.grant_with_conn(move |inner, mut conn| async move {
                let reply = conn.grant(&request).await.map_err(|e| inner.failure(e))?;
                Ok(answer(reply))
            });
        };
        let (lock, token) = (key.to_owned(), token.to_owned());
        // Given up while the replicated connection was still being made: not sent.
        let given_up = GivenUp::default();
        let check = given_up.clone();
        self.run(move |inner| async move {
            let (reply, acked) = inner
                .write_and_wait(w, Some(&check), |c| {
                    Box::pin(async move { request.send(c).await })
                })
                .await?;
            if reply.0 == 1 && acked < w.replicas {
                inner.give_back(&lock, &token).await;
                return Err(Inner::replication_failure(w, acked));
            }
            Ok(answer(reply))
        })
        .given_up_by(given_up)
    }
}

fn set_nx(key: &str, token: &str, ttl: u32) -> redis::Cmd {
    let mut cmd = redis::cmd("SET");
    cmd.arg(key).arg(token).arg("NX").arg("PX").arg(ttl);
    cmd
}

/// One grant request, answered as a [`GrantReply`]. A try or a first attempt is the plain
/// `SET NX PX` (a reserved key is not free to it); a queued attempt runs the queue script.
enum GrantRequest {
    SetNx(redis::Cmd),
    Script {
        script: &'static Lua,
        keys: Vec<String>,
        args: [String; 6],
    },
}

impl GrantRequest {
    /// A fenced try (no place), or a queued attempt.
    fn script(
        keys: Vec<String>,
        token: &str,
        ttl: u32,
        place: String,
        lease: u32,
        fenced: bool,
    ) -> Self {
        let script = if place.is_empty() {
            &scripts().try_fenced
        } else {
            &scripts().acquire
        };
        let args = [
            token.to_owned(),
            ttl.to_string(),
            place,
            lease.to_string(),
            if fenced { "1" } else { "0" }.to_owned(),
            FENCE_COUNTER_KEEP_MS.to_string(),
        ];
        GrantRequest::Script { script, keys, args }
    }

    async fn send<C: redis::aio::ConnectionLike + Send>(
        &self,
        conn: &mut C,
    ) -> Result<GrantReply, RedisError> {
        match self {
            GrantRequest::SetNx(cmd) => {
                let set: Option<String> = cmd.query_async(conn).await?;
                Ok(if set.is_some() { (1, 0) } else { (0, -1) })
            }
            GrantRequest::Script { script, keys, args } => {
                run_lua(conn, script, &script.evalsha(keys, args)).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_unknown_to_the_server_goes_again_as_an_eval_of_its_body() {
        let lua = Lua::new("return {KEYS[1], ARGV[1]}".to_owned());
        let words = |cmd: &redis::Cmd| -> Vec<String> {
            cmd.args_iter()
                .map(|a| match a {
                    redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                    _ => "<not simple>".to_owned(),
                })
                .collect()
        };
        let evalsha = lua.evalsha(&["k"], &["a", "b"]);
        assert_eq!(words(&evalsha), ["EVALSHA", lua.hash(), "1", "k", "a", "b"]);
        let eval = lua.eval_of(&evalsha);
        assert_eq!(
            words(&eval),
            ["EVAL", lua.body.as_str(), "1", "k", "a", "b"]
        );
    }

    #[test]
    fn the_scripts_and_peek_agree_on_the_marks() {
        assert!(QUEUE_PRELUDE.contains(&format!("local RESERVED = '{RESERVED_PREFIX}'")));
        assert!(QUEUE_PRELUDE.contains(&format!("local WAITED = '{WAITED_SUFFIX}'")));
        for script in [RELEASE_FAST, EXTEND, EXTEND_MANY, IS_HELD] {
            assert!(script.contains(&format!(".. '{WAITED_SUFFIX}'")));
        }
        // A standalone release names the queue's keys itself, as lock_keys does.
        assert_eq!(
            lock_keys("k", false, false),
            ["k", "k:locco-q", "k:locco-qt"]
        );
        assert!(QUEUE_PRELUDE.contains("KEYS[2] or KEYS[1] .. ':locco-q'"));
        assert!(QUEUE_PRELUDE.contains("KEYS[3] or KEYS[1] .. ':locco-qt'"));
    }

    #[test]
    fn the_operator_scripts_share_one_test_of_a_lock() {
        let lock_at = lock_at_lua();
        for side in SIDE_SUFFIXES {
            assert!(lock_at.contains(&format!("'{side}'")));
        }
        for key in lock_keys("k", true, true).iter().skip(1) {
            assert!(SIDE_SUFFIXES.iter().any(|s| key.ends_with(s)), "{key}");
        }
        assert!(lock_at.contains(&format!("'{RESERVED_PREFIX}'")));
        assert!(scripts().inspect.body.starts_with(&lock_at));
        assert!(scripts().force_release.body.contains(&lock_at));
        assert!(
            INSPECT.contains("lock_at(KEYS[1])") && FORCE_RELEASE_BODY.contains("lock_at(KEYS[1])")
        );
    }

    #[test]
    fn slots_match_redis_cluster_keyslot() {
        // Values from CLUSTER KEYSLOT.
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
        assert_eq!(slot_of("123456789"), 12739);
    }

    #[test]
    fn fence_counters_share_the_lock_slot() {
        assert_eq!(fence_key("order:1"), "{order:1}:locco-fence");
        assert_eq!(fence_key("{order}:1"), "{order}:1:locco-fence");
        assert_eq!(hash_tag("a{}b"), None);
        assert_eq!(hash_tag("a{b}c"), Some("b"));
    }

    #[test]
    fn passwords_are_redacted() {
        let secrets = secrets_of(&["redis://app:s3cr%40t@localhost:6379".to_string()]);
        assert_eq!(
            redact(&secrets, "auth s3cr@t failed (s3cr%40t)".into()),
            "auth *** failed (***)"
        );
    }
}
