//! maxmemory with noeviction: TB.CONSUME (deny-oom) fails with OOM and
//! writes nothing, while the read-only TB.PEEK still answers.

use testkit::{consume, error_of, hgetall, int, out_of_memory, peek, Server};

#[test]
fn oom_denies_writes_but_peek_answers() {
    let s = Server::start();
    let mut c = s.conn();
    consume(&mut c, "rl:old", "10", "0.01", "3");
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
    ] {
        let err = error_of(&mut c, redis::cmd(args[0]).arg(&args[1..]));
        assert!(err.starts_with("OOM"), "{args:?}: {err}");
    }
    assert_eq!(int(&mut c, "EXISTS", "rl:new"), 0);
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
