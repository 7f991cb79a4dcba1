//! The exhaustive check of the Redis lock protocol's model, and proof that it can fail: each
//! rule broken on purpose is found.

use std::time::Instant;

use locco_model::{Faults, Mutation, Protocol, MUTATIONS};
use stateright::{Checker, HasDiscoveries, Model};

const FAILURES: [&str; 5] = [
    "two holders never overlap",
    "held means the server has it",
    "fences grow",
    "granted in the order first joined",
    "every live waiter is granted",
];

fn check(p: Protocol, label: &str) {
    let started = Instant::now();
    let checker = p.checker().threads(2).spawn_bfs().join();
    println!(
        "{label}: {} states explored ({} distinct), depth {}, in {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    for name in FAILURES {
        if let Some(path) = checker.discovery(name) {
            panic!(
                "{label}: `{name}` is broken:\n{}",
                path.into_actions()
                    .iter()
                    .map(|a| format!("  {a:?}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }
    // The bound reaches what it claims to cover.
    assert!(
        checker.discovery("a grant after a restart").is_some(),
        "{label}: no run grants a key after a server restart"
    );
}

#[test]
fn three_processes_on_one_key_with_a_crash_a_lost_message_a_restart_and_a_pause() {
    check(Protocol::standard(), "3 processes, 1 key");
}

#[test]
fn three_processes_with_four_waiters_on_two_keys() {
    check(Protocol::two_keys(), "3 processes, 4 waiters, 2 keys");
}

/// Each rule broken on purpose makes the checker fail, with a counterexample.
#[test]
fn every_broken_rule_is_found() {
    for m in MUTATIONS {
        let started = Instant::now();
        let p = Protocol {
            mutation: Some(m),
            ..Protocol::standard()
        };
        let checker = p
            .checker()
            .threads(2)
            .finish_when(HasDiscoveries::AnyFailures)
            .spawn_bfs()
            .join();
        let found: Vec<_> = FAILURES
            .iter()
            .filter_map(|&name| checker.discovery(name).map(|path| (name, path)))
            .collect();
        let (name, path) = found
            .first()
            .unwrap_or_else(|| panic!("{m:?}: the checker found no counterexample"));
        println!(
            "{m:?}: `{name}` broken after {} steps ({} states, {:.1?})",
            path.clone().into_actions().len(),
            checker.unique_state_count(),
            started.elapsed()
        );
        let expected = match m {
            Mutation::HandOffIgnoresDeadline => "every live waiter is granted",
            Mutation::FenceWithoutTime => "fences grow",
            _ => "held means the server has it",
        };
        assert!(
            found.iter().any(|(n, _)| *n == expected),
            "{m:?}: expected `{expected}` to break, found {:?}",
            found.iter().map(|f| f.0).collect::<Vec<_>>()
        );
    }
}

/// In the window after a lease ran out and before the head looks again, more than the one
/// newcomer that docs/fair-queue.md allows may pass live waiters (see
/// `Protocol::lapse_window_is_exception`). (A newcomer needs a waiter that asks twice; one
/// crash is the only fault.)
#[test]
fn the_lapse_window_lets_more_than_one_newcomer_pass() {
    let order = "granted in the order first joined";
    let p = Protocol {
        lapse_window_is_exception: false,
        acquisitions: 2,
        faults: Faults {
            crash: 1,
            loss: 0,
            restart: 0,
            pause: 0,
            leave: 0,
        },
        quiet_from: 7,
        horizon: 7,
        ..Protocol::standard()
    };
    let checker = p
        .checker()
        .threads(2)
        .finish_when(HasDiscoveries::AnyOf([order].into()))
        .spawn_bfs()
        .join();
    let path = checker
        .discovery(order)
        .expect("a second newcomer passes in the window");
    println!(
        "lapse window ({} states): {} steps:\n{}",
        checker.unique_state_count(),
        path.clone().into_actions().len(),
        path.into_actions()
            .iter()
            .map(|a| format!("  {a:?}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
