//! maxmemory with noeviction: the writers (deny-oom), CL.THROTTLE among
//! them, fail with OOM and write nothing, while the read-only TB.PEEK still
//! answers.

use testkit::{consume, error_of, hgetall, int, out_of_memory, peek, server_time_us, Server};

#[test]
fn oom_denies_writes_but_peek_answers() {
    let s = Server::start();
    let mut c = s.conn();
    consume(&mut c, "rl:old", "10", "0.01", "3");
    // A key redis-cell left: its TAT, a minute ahead.
    let tat = ((server_time_us(&mut c) + 60_000_000) * 1000).to_string();
    let _: () = redis::cmd("SET")
        .arg("rl:cell")
        .arg(&tat)
        .query(&mut c)
        .unwrap();
    out_of_memory(&mut c, 4 << 20);
    let before = (
        hgetall(&mut c, "rl:old"),
        int(&mut c, "PEXPIRETIME", "rl:old"),
    );

    for args in [
        &["TB.CONSUME", "rl:new", "10", "1"][..],
        &["TB.CONSUME", "rl:old", "10", "0.01", "1"],
        &["TB.MCONSUME", "rl:new", "10", "1", "1"],
        &["TB.ADJUST", "rl:old", "10", "0.01", "1"],
        // CL.THROTTLE too, even a check (quantity 0) or one that would be
        // limited: Redis refuses a deny-oom command before it runs.
        &["CL.THROTTLE", "rl:new", "9", "1", "1"],
        &["CL.THROTTLE", "rl:old", "9", "1", "100", "0"],
        &["CL.THROTTLE", "rl:cell", "15", "30", "60"],
        &["CL.THROTTLE", "rl:cell", "15", "30", "60", "16"],
    ] {
        let err = error_of(&mut c, redis::cmd(args[0]).arg(&args[1..]));
        assert!(err.starts_with("OOM"), "{args:?}: {err}");
    }
    assert_eq!(int(&mut c, "EXISTS", "rl:new"), 0);
    let cell: String = redis::cmd("GET").arg("rl:cell").query(&mut c).unwrap();
    assert_eq!(cell, tat, "the redis-cell key is left as it was");
    assert_eq!(
        (
            hgetall(&mut c, "rl:old"),
            int(&mut c, "PEXPIRETIME", "rl:old")
        ),
        before
    );
    assert_eq!(peek(&mut c, "rl:old", "10", "0.01", "1")[0..2], [1, 7]);
    assert_eq!(peek(&mut c, "rl:new", "10", "1", "1"), vec![1, 10, 0, 0]);
}
