//! The Lua scripts: the queue's prelude and the verbs built on it, the marks they write into a
//! lock's value, and how a script is sent (EVALSHA, then EVAL of its body on NOSCRIPT).

use std::sync::OnceLock;

use redis::{RedisError, Script};

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

/// The most keys one EXTEND_MANY call takes.
pub(super) const MAX_KEYS_PER_SCRIPT: usize = 1000;

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
pub(super) const SIDE_SUFFIXES: [&str; 3] = [":locco-q", ":locco-qt", ":locco-fence"];

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
pub(super) const RESERVED_PREFIX: &str = "locco:reserved|";
/// After the token of a key held while someone waits (the scripts' `WAITED`).
pub(super) const WAITED_SUFFIX: &str = "|locco:waited";

/// A fence counter lives this long after its key's last grant.
pub(super) const FENCE_COUNTER_KEEP_MS: u64 = 24 * 60 * 60 * 1000;

/// A script, sent as EVALSHA. A server that does not know it yet (new, restarted, or a
/// replica just promoted) is sent the same call as an EVAL of its body, which also keeps it
/// there for the next EVALSHA. Not SCRIPT LOAD: on a Cluster that goes to every master, so an
/// operation on one key would wait for the slowest master of all (or fail with one that is
/// down).
pub(super) struct Lua {
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

    pub(super) fn hash(&self) -> &str {
        self.script.get_hash()
    }

    /// The EVALSHA of this script with `keys` and `args`.
    pub(super) fn evalsha<K: AsRef<str>, A: AsRef<str>>(
        &self,
        keys: &[K],
        args: &[A],
    ) -> redis::Cmd {
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
    pub(super) fn eval_of(&self, evalsha: &redis::Cmd) -> redis::Cmd {
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
pub(super) async fn run_lua<T: redis::FromRedisValue, C: redis::aio::ConnectionLike>(
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
pub(super) fn unknown_script(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

pub(super) struct Scripts {
    pub(super) acquire: Lua,
    pub(super) try_fenced: Lua,
    pub(super) release: Lua,
    pub(super) leave: Lua,
    pub(super) extend: Lua,
    pub(super) extend_many: Lua,
    pub(super) is_held: Lua,
    pub(super) inspect: Lua,
    pub(super) force_release: Lua,
}

pub(super) fn scripts() -> &'static Scripts {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::redis::keys::lock_keys;

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
}
