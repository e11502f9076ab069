//! Panic containment: a handler that panics (TB.PANIC, only in builds with
//! the `test-hooks` feature) answers an error, logs the panic through the
//! Redis log, counts it in INFO, and leaves the server serving.

use testkit::{consume, error_of, snapshot, tb_counter, test_hooks_config, Server};

fn panics(c: &mut redis::Connection) -> u64 {
    tb_counter(c, "tb_panics")
}

#[test]
fn a_panicking_command_is_contained_logged_and_counted() {
    let s = Server::with(test_hooks_config());
    let mut c = s.conn();
    consume(&mut c, "k", "10", "1", "3");
    let before = snapshot(&mut c);
    assert_eq!(panics(&mut c), 0);

    let err = error_of(&mut c, &redis::cmd("TB.PANIC"));
    assert_eq!(
        err,
        "ERR tb internal error: the command failed and was contained, see the server log"
    );

    // The same connection and the server go on.
    let mut s = s;
    assert!(s.is_alive(), "server died:\n{}", s.log());
    let pong: String = redis::cmd("PING").query(&mut c).expect("PING");
    assert_eq!(pong, "PONG");
    assert_eq!(snapshot(&mut c), before, "the panic changed the dataset");
    let r = consume(&mut c, "k", "10", "1", "1");
    assert_eq!((r[0], r[1]), (1, 6), "bucket k after the panic: {r:?}");
    assert_eq!(consume(&mut c, "fresh", "5", "1", "1")[..2], [1, 4]);

    let log = s.log();
    assert!(
        log.contains("tb: panic contained in a command handler")
            && log.contains("TB.PANIC was called (test-hooks build)"),
        "panic message not in the server log:\n{log}"
    );
    assert_eq!(panics(&mut c), 1);

    // Again, from a second client: still contained, still counted.
    let mut c2 = s.conn();
    error_of(&mut c2, &redis::cmd("TB.PANIC"));
    assert_eq!(panics(&mut c), 2);
    assert_eq!(
        tb_counter(&mut c, "tb_errors"),
        2,
        "each panic counts as one error, and nothing else failed"
    );
    assert_eq!(
        log_count(&s.log(), "TB.PANIC was called"),
        2,
        "one log entry per panic"
    );
    assert!(s.is_alive());
}

fn log_count(log: &str, needle: &str) -> usize {
    log.matches(needle).count()
}

#[test]
fn release_build_has_no_panic_command() {
    let s = Server::start();
    let mut c = s.conn();
    let err = error_of(&mut c, &redis::cmd("TB.PANIC"));
    assert!(err.contains("unknown command"), "{err}");
    let listed: redis::Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("tb.panic")
        .query(&mut c)
        .expect("COMMAND INFO");
    assert_eq!(
        listed,
        redis::Value::Array(vec![redis::Value::Nil]),
        "tb.panic is registered"
    );
    assert_eq!(panics(&mut c), 0);
}
