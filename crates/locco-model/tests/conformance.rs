//! Conformance: the model's steps, replayed as the real scripts against a real redis-server,
//! leave the server as the model says, answer as it says and push whom it says. The scripts
//! are read from `crates/locco-core/src/backend/redis/scripts.rs` and put together as
//! `scripts()` there puts them, so the model cannot drift from the code unseen.
//!
//! One model tick is `TICK_MS` of real time; every step of tick `t` runs near the middle of
//! its tick, and every lease the model counts in ticks is sent as `ticks * TICK_MS - TICK_MS/2`
//! ms, so it ends on a tick boundary, half a tick from any step.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use locco_model::{Action, Call, Key, Msg, Mutation, Protocol, State, Val};
use stateright::{Checker, HasDiscoveries, Model};

const TICK_MS: u64 = 120;
/// How far from the middle of its tick a step may run.
const SLACK_MS: u64 = TICK_MS / 4;

// --- the scripts, from the source -------------------------------------------------------------

const SOURCE: &str = include_str!("../../locco-core/src/backend/redis/scripts.rs");

fn constant(name: &str) -> &'static str {
    let start = format!("const {name}: &str = r\"");
    let at = SOURCE
        .find(&start)
        .unwrap_or_else(|| panic!("scripts.rs has no `{start}`"))
        + start.len();
    let len = SOURCE[at..].find("\";").expect("a raw string's end");
    &SOURCE[at..at + len]
}

struct Scripts {
    acquire: String,
    try_fenced: String,
    release: String,
    leave: String,
}

fn scripts() -> Scripts {
    // As `scripts()` in scripts.rs puts them together; the test fails if that changes.
    for line in [
        r#"acquire: queued(&format!("{GRANT_FENCE}{ACQUIRE_BODY}")),"#,
        r#"try_fenced: Lua::new(format!("{GRANT_FENCE}{TRY_FENCED}")),"#,
        r#"release: Lua::new(format!("{RELEASE_FAST}{QUEUE_PRELUDE}{RELEASE_BODY}")),"#,
        r#"leave: queued(LEAVE_BODY),"#,
        r#"let queued = |body: &str| Lua::new(format!("{QUEUE_PRELUDE}{body}"));"#,
    ] {
        assert!(
            SOURCE.contains(line),
            "scripts.rs no longer has `{line}`: update the model"
        );
    }
    let prelude = constant("QUEUE_PRELUDE");
    Scripts {
        acquire: [prelude, constant("GRANT_FENCE"), constant("ACQUIRE_BODY")].concat(),
        try_fenced: [constant("GRANT_FENCE"), constant("TRY_FENCED")].concat(),
        release: [constant("RELEASE_FAST"), prelude, constant("RELEASE_BODY")].concat(),
        leave: [prelude, constant("LEAVE_BODY")].concat(),
    }
}

// --- a real server and a small RESP client ------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
enum Reply {
    Status(String),
    Int(i64),
    Bulk(Option<String>),
    Array(Vec<Reply>),
}

struct Conn(BufReader<TcpStream>);

impl Conn {
    fn open(port: u16) -> std::io::Result<Conn> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        Ok(Conn(BufReader::new(s)))
    }

    fn send(&mut self, args: &[&str]) {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend(format!("${}\r\n", a.len()).bytes());
            out.extend(a.bytes());
            out.extend(b"\r\n");
        }
        self.0
            .get_mut()
            .write_all(&out)
            .expect("write to redis-server");
    }

    fn read(&mut self) -> Reply {
        let mut line = String::new();
        self.0.read_line(&mut line).expect("read from redis-server");
        let (kind, rest) = line.trim_end().split_at(1);
        match kind {
            "+" => Reply::Status(rest.to_owned()),
            "-" => panic!("redis-server: {rest}"),
            ":" => Reply::Int(rest.parse().unwrap()),
            "$" => {
                let n: i64 = rest.parse().unwrap();
                if n < 0 {
                    return Reply::Bulk(None);
                }
                let mut buf = vec![0; n as usize + 2];
                self.0.read_exact(&mut buf).unwrap();
                buf.truncate(n as usize);
                Reply::Bulk(Some(String::from_utf8(buf).unwrap()))
            }
            "*" => {
                let n: i64 = rest.parse().unwrap();
                Reply::Array((0..n.max(0)).map(|_| self.read()).collect())
            }
            other => panic!("unexpected reply {other:?}{rest}"),
        }
    }

    fn call(&mut self, args: &[&str]) -> Reply {
        self.send(args);
        self.read()
    }

    fn int(&mut self, args: &[&str]) -> i64 {
        match self.call(args) {
            Reply::Int(n) => n,
            r => panic!("{args:?}: {r:?}"),
        }
    }
}

struct Server {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Server {
    fn start() -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!("locco-model-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (scripts/test-all.sh installs it)");
        let server = Server { child, dir, port };
        let started = Instant::now();
        while Conn::open(port).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// --- the replay ---------------------------------------------------------------------------------

struct Replay<'a> {
    p: &'a Protocol,
    scripts: Scripts,
    conn: Conn,
    pushes: Conn,
    /// Tick 0's start, on this machine's clock and on the server's (ms).
    t0: Instant,
    server_t0: u64,
    last_fence: Vec<u64>,
    pub calls: usize,
}

fn key_name(k: u8) -> String {
    format!("lock{k}")
}

fn place(p: &Protocol, w: u8) -> String {
    format!("c{}|w{w}", p.process_of[w as usize])
}

fn token(t: locco_model::Tok) -> String {
    format!("w{}.{}", t.w, t.n)
}

fn ms(ticks: u8) -> String {
    (ticks as u64 * TICK_MS - TICK_MS / 2).to_string()
}

impl<'a> Replay<'a> {
    fn new(p: &'a Protocol, server: &Server) -> Replay<'a> {
        let mut conn = Conn::open(server.port).unwrap();
        assert_eq!(conn.call(&["FLUSHALL"]), Reply::Status("OK".into()));
        let mut pushes = Conn::open(server.port).unwrap();
        pushes.call(&["PSUBSCRIBE", "locco:wake:*"]);
        let t0 = Instant::now();
        let server_t0 = server_ms(&mut conn);
        Replay {
            p,
            scripts: scripts(),
            conn,
            pushes,
            t0,
            server_t0,
            last_fence: vec![0; p.keys as usize],
            calls: 0,
        }
    }

    /// Waits for the middle of tick `now`; fails when a step runs too far from it.
    fn at(&self, now: u8) -> Result<(), String> {
        let mid = Duration::from_millis(now as u64 * TICK_MS + TICK_MS / 2);
        let elapsed = self.t0.elapsed();
        if elapsed < mid {
            std::thread::sleep(mid - elapsed);
        } else if elapsed - mid > Duration::from_millis(SLACK_MS) {
            return Err(format!(
                "tick {now} ran {:?} past its middle: the machine is too busy for {TICK_MS} ms ticks",
                elapsed - mid
            ));
        }
        Ok(())
    }

    fn eval(&mut self, body: &str, keys: &[String], args: &[String]) -> Reply {
        let n = keys.len().to_string();
        let mut all: Vec<&str> = vec!["EVAL", body, &n];
        all.extend(keys.iter().map(String::as_str));
        all.extend(args.iter().map(String::as_str));
        self.conn.call(&all)
    }

    /// Runs `call` as the real script; compares its answer with the model's.
    fn run(&mut self, s: &State, call: Call) -> Result<(), String> {
        self.at(s.now)?;
        self.calls += 1;
        let p = self.p;
        let mut model = s.server.clone();
        let e = model.run(p, call, s.now);
        let fenced = |k: u8| {
            let name = key_name(k);
            vec![
                name.clone(),
                format!("{name}:locco-q"),
                format!("{name}:locco-qt"),
                format!("{{{name}}}:locco-fence"),
            ]
        };
        let grant_args = |tok, w| {
            vec![
                token(tok),
                ms(p.ttl),
                place(p, w),
                ms(p.place_lease),
                "1".to_owned(),
                (24 * 60 * 60 * 1000).to_string(),
            ]
        };
        let (granted, hint, int) = match call {
            Call::Try { key, tok } => {
                let mut args = grant_args(tok, tok.w);
                args[2] = String::new();
                args[3] = "0".to_owned();
                let r = self.eval(&self.scripts.try_fenced.clone(), &fenced(key), &args);
                self.grant_reply(key, r)?
            }
            Call::Acquire { key, tok } => {
                let r = self.eval(
                    &self.scripts.acquire.clone(),
                    &fenced(key),
                    &grant_args(tok, tok.w),
                );
                self.grant_reply(key, r)?
            }
            Call::Release { key, tok } => {
                // On a standalone server a release is sent the lock's key alone.
                let r = self.eval(
                    &self.scripts.release.clone(),
                    &[key_name(key)],
                    &[token(tok)],
                );
                (false, false, int_of(&r))
            }
            Call::Leave { key, w } => {
                let r = self.eval(
                    &self.scripts.leave.clone(),
                    &fenced(key)[..3],
                    &[place(p, w)],
                );
                (false, false, int_of(&r))
            }
        };
        match call {
            Call::Try { .. } | Call::Acquire { .. } => {
                if granted != e.granted.is_some() || (!granted && hint != e.hint) {
                    return Err(format!(
                        "{call:?} at tick {}: redis answered granted={granted} hint={hint}, the model {:?}",
                        s.now, e
                    ));
                }
            }
            _ => {
                if int != e.int {
                    return Err(format!(
                        "{call:?} at tick {}: redis answered {int}, the model {}",
                        s.now, e.int
                    ));
                }
            }
        }
        for &w in &e.pushes {
            let want = place(p, w);
            match self.pushes.read() {
                Reply::Array(m) if m.len() == 4 && m[3] == Reply::Bulk(Some(want.clone())) => {}
                other => {
                    return Err(format!(
                        "{call:?} at tick {}: push {other:?}, the model pushes {want}",
                        s.now
                    ))
                }
            }
        }
        Ok(())
    }

    fn grant_reply(&mut self, key: u8, r: Reply) -> Result<(bool, bool, i64), String> {
        let Reply::Array(v) = r else {
            return Err(format!("not an array: {r:?}"));
        };
        let (granted, n) = (int_of(&v[0]) == 1, int_of(&v[1]));
        if granted {
            let fence = n as u64;
            if fence <= self.last_fence[key as usize] {
                return Err(format!(
                    "fence {fence} after {}",
                    self.last_fence[key as usize]
                ));
            }
            self.last_fence[key as usize] = fence;
        }
        Ok((granted, n >= 0, n))
    }

    /// The server's keys, as the model's (leases within half a tick).
    fn compare(&mut self, s: &State) -> Result<(), String> {
        self.at(s.now)?;
        let now_ms = server_ms(&mut self.conn);
        let t0 = self.server_t0;
        let tick_ms = |t: u8| t0 + t as u64 * TICK_MS;
        let close = |what: &str, real: i64, want: i64| -> Result<(), String> {
            if (real - want).abs() < (TICK_MS / 2) as i64 {
                Ok(())
            } else {
                Err(format!(
                    "{what}: redis {real} ms, the model {want} ms (tick {})",
                    s.now
                ))
            }
        };
        let left = |t: u8| tick_ms(t) as i64 - now_ms as i64;
        for (k, want) in s.server.visible(s.now).iter().enumerate() {
            let name = key_name(k as u8);
            let value = match self.conn.call(&["GET", &name]) {
                Reply::Bulk(v) => v,
                r => return Err(format!("GET {name}: {r:?}")),
            };
            let expected = want.val.as_ref().map(|(v, _)| match v {
                Val::Held { tok, waited } => {
                    format!(
                        "{}{}",
                        token(*tok),
                        if *waited { "|locco:waited" } else { "" }
                    )
                }
                Val::Reserved(w) => format!("locco:reserved|{}", place(self.p, *w)),
            });
            if value != expected {
                return Err(format!(
                    "{name} at tick {}: redis {value:?}, the model {expected:?}",
                    s.now
                ));
            }
            if let Some((_, exp)) = want.val {
                let pttl = self.conn.int(&["PTTL", &name]);
                close(&format!("{name}'s lease"), pttl, left(exp))?;
            }
            self.compare_queue(&name, want, &left, &close, s.now)?;
            let fence = self
                .conn
                .int(&["EXISTS", &format!("{{{name}}}:locco-fence")]);
            if (fence == 1) != want.fence.is_some() {
                return Err(format!(
                    "{name}'s fence counter: redis {fence}, the model {:?}",
                    want.fence
                ));
            }
        }
        Ok(())
    }

    fn compare_queue(
        &mut self,
        name: &str,
        want: &Key,
        left: &dyn Fn(u8) -> i64,
        close: &dyn Fn(&str, i64, i64) -> Result<(), String>,
        now: u8,
    ) -> Result<(), String> {
        let q = format!("{name}:locco-q");
        let queue = strings(self.conn.call(&["LRANGE", &q, "0", "-1"]));
        let expected: Vec<String> = want.queue.iter().map(|&w| place(self.p, w)).collect();
        if queue != expected {
            return Err(format!(
                "{q} at tick {now}: redis {queue:?}, the model {expected:?}"
            ));
        }
        if !queue.is_empty() {
            close(&q, self.conn.int(&["PTTL", &q]), left(want.queue_exp))?;
        }
        let qt = format!("{name}:locco-qt");
        let places = strings(self.conn.call(&["ZRANGE", &qt, "0", "-1", "WITHSCORES"]));
        let mut real: Vec<(String, i64)> = places
            .chunks(2)
            .map(|c| (c[0].clone(), c[1].parse().unwrap()))
            .collect();
        real.sort();
        let mut expected: Vec<(String, u8)> = want
            .places
            .iter()
            .map(|&(w, d)| (place(self.p, w), d))
            .collect();
        expected.sort();
        if real.len() != expected.len() || real.iter().zip(&expected).any(|(a, b)| a.0 != b.0) {
            return Err(format!(
                "{qt} at tick {now}: redis {real:?}, the model {expected:?}"
            ));
        }
        for ((place, score), (_, d)) in real.iter().zip(&expected) {
            // A deadline is the server's time in ms.
            let at = (self.server_t0 + *d as u64 * TICK_MS) as i64;
            close(&format!("{place}'s deadline"), *score, at)?;
        }
        if !real.is_empty() {
            close(&qt, self.conn.int(&["PTTL", &qt]), left(want.places_exp))?;
        }
        Ok(())
    }

    /// Replays one step that led from `s` to `next`.
    fn step(&mut self, s: &State, a: &Action, next: &State) -> Result<(), String> {
        match a {
            Action::Deliver(Msg::Req { call, .. }) => self.run(s, *call)?,
            Action::Restart => {
                // A restart without persistence: the data is gone.
                self.at(s.now)?;
                self.conn.call(&["FLUSHALL"]);
            }
            _ => {}
        }
        self.compare(next)
    }
}

fn int_of(r: &Reply) -> i64 {
    match r {
        Reply::Int(n) => *n,
        r => panic!("not an integer: {r:?}"),
    }
}

fn strings(r: Reply) -> Vec<String> {
    match r {
        Reply::Array(v) => v
            .into_iter()
            .map(|x| match x {
                Reply::Bulk(Some(s)) => s,
                r => panic!("{r:?}"),
            })
            .collect(),
        r => panic!("{r:?}"),
    }
}

fn server_ms(conn: &mut Conn) -> u64 {
    let t = strings(conn.call(&["TIME"]));
    t[0].parse::<u64>().unwrap() * 1000 + t[1].parse::<u64>().unwrap() / 1000
}

/// splitmix64.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// A random walk of `steps` steps through the model, each replayed on the server.
fn walk(p: &Protocol, seed: u64, steps: usize) -> Result<(usize, usize), String> {
    let server = Server::start();
    let mut replay = Replay::new(p, &server);
    let mut rng = Rng(seed);
    let mut s = p.init_states().remove(0);
    let mut actions = vec![];
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    let mut taken = 0;
    for i in 0..steps {
        actions.clear();
        p.actions(&s, &mut actions);
        if actions.is_empty() {
            break;
        }
        // The tick passes about one step in thirteen, and a fault (or a resume, or a waiter
        // giving up) is one step in twenty: most steps are attempts, releases and messages.
        let (faults, others): (Vec<&Action>, Vec<&Action>) = actions
            .iter()
            .filter(|a| **a != Action::Tick)
            .partition(|a| {
                matches!(
                    a,
                    Action::Lose(_)
                        | Action::Crash(_)
                        | Action::Pause(_)
                        | Action::Resume(_)
                        | Action::Restart
                        | Action::GiveUp(_)
                )
            });
        let roll = rng.next() % 40;
        let pick = |v: &[&Action], r: u64| v[(r % v.len() as u64) as usize].clone();
        let a = if roll < 3 || (faults.is_empty() && others.is_empty()) {
            Action::Tick
        } else if (roll < 7 && !faults.is_empty()) || others.is_empty() {
            pick(&faults, rng.next())
        } else {
            pick(&others, rng.next())
        };
        let kind = format!("{a:?}");
        *kinds
            .entry(kind.split(['(', ' ']).next().unwrap().to_owned())
            .or_insert(0) += 1;
        let next = p.next_state(&s, a.clone()).unwrap();
        replay
            .step(&s, &a, &next)
            .map_err(|e| format!("seed {seed}, step {i} ({a:?}): {e}"))?;
        s = next;
        taken += 1;
    }
    println!("walk {seed}: {kinds:?}");
    Ok((taken, replay.calls))
}

/// Walks with faults all along: a long horizon, every waiter acquiring again and again.
fn walker(two_keys: bool) -> Protocol {
    let base = if two_keys {
        Protocol::two_keys()
    } else {
        Protocol::standard()
    };
    Protocol {
        acquisitions: 200,
        horizon: 250,
        quiet_from: 250,
        faults: locco_model::Faults {
            crash: 1,
            loss: 40,
            restart: 3,
            pause: 10,
            leave: 20,
        },
        ..base
    }
}

/// The replays keep to their ticks only on a machine that is not busy: one at a time, and
/// never beside this file's exhaustive checks.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn random_walks_match_a_real_redis() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut total = 0;
    for (seed, two_keys) in [(1, false), (2, true), (3, false)] {
        let p = walker(two_keys);
        let (steps, calls) = walk(&p, seed, 4000).unwrap_or_else(|e| panic!("{e}"));
        println!("walk {seed}: {steps} steps, {calls} script calls, all as the model says");
        assert!(calls > 250, "too few script calls: {calls}");
        total += steps;
    }
    assert!(total > 3000, "{total} steps");
}

/// The counterexamples the checker finds for rules broken on the holder's side (or in the
/// fence, which the replay does not compare: the real one is the server's time) replay as they
/// are, the server's part being the real one; those broken in what the scripts store do not:
/// the replay tells the model's scripts from the real ones.
#[test]
fn counterexamples_replay_on_a_real_redis() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let server = Server::start();
    for m in locco_model::MUTATIONS {
        let p = Protocol {
            mutation: Some(m),
            ..Protocol::standard()
        };
        let checker = p
            .clone()
            .checker()
            .threads(2)
            .finish_when(HasDiscoveries::AnyFailures)
            // Depth first: a counterexample, not the shortest, in a fraction of the time.
            .spawn_dfs()
            .join();
        let (_, path) = checker
            .discoveries()
            .into_iter()
            .find(|(name, _)| *name != "a grant after a restart")
            .unwrap_or_else(|| panic!("{m:?}: no counterexample"));
        let steps = path.into_vec();
        let mut replay = Replay::new(&p, &server);
        let outcome = steps.windows(2).try_for_each(|w| {
            let (s, a) = (&w[0].0, w[0].1.as_ref().unwrap());
            replay.step(s, a, &w[1].0)
        });
        let in_scripts = matches!(
            m,
            Mutation::ReleaseIgnoresToken | Mutation::HandOffIgnoresDeadline
        );
        println!("{m:?}: {} steps replayed: {outcome:?}", steps.len());
        match (in_scripts, outcome) {
            (false, Err(e)) => panic!("{m:?}: the counterexample does not replay: {e}"),
            (true, Ok(())) => panic!("{m:?}: the replay did not tell the broken script"),
            _ => {}
        }
    }
}
