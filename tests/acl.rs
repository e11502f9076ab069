//! ACL: a user limited to `~rl:*` and the TB commands can't reach other
//! keys through any TB command, and the commands sit in the right ACL
//! categories where the server supports module categories.

use testkit::{consume, error_of, info_field, peek, snapshot, Server};

/// The bucket commands, which the users below may run.
const BUCKET_COMMANDS: [&str; 9] = [
    "tb.consume",
    "tb.peek",
    "tb.mconsume",
    "tb.adjust",
    "cl.throttle",
    "tb.quota",
    "tb.qpeek",
    "tb.qadjust",
    "tb.charge",
];

#[test]
fn key_patterns_cover_every_tb_command_and_every_mconsume_key() {
    let s = Server::start();
    let mut admin = s.conn();
    let _: () = redis::cmd("HSET")
        .arg(&["secret:bucket", "tokens", "1", "ts", "1"])
        .query(&mut admin)
        .unwrap();
    let mut c = s.conn_limited("limited", "~rl:*", &BUCKET_COMMANDS);

    assert_eq!(consume(&mut c, "rl:ok", "10", "0.01", "1")[0], 1);
    let before = snapshot(&mut admin);
    let denied: [&[&str]; 12] = [
        &["TB.CONSUME", "secret:new", "10", "1"],
        &["TB.QUOTA", "secret:q", "10", "DAY"],
        &["TB.QPEEK", "secret:q", "10", "DAY"],
        &["TB.QADJUST", "secret:q", "10", "DAY", "1"],
        &[
            "TB.CHARGE",
            "2",
            "rl:ok",
            "secret:q",
            "BUCKET",
            "10",
            "0.01",
            "1",
            "QUOTA",
            "5",
            "DAY",
            "1",
        ],
        &[
            "TB.CHARGE",
            "1",
            "secret:x",
            "WAIT",
            "10",
            "BUCKET",
            "10",
            "1",
            "1",
        ],
        &["CL.THROTTLE", "secret:bucket", "9", "1", "1"],
        &["TB.PEEK", "secret:bucket", "10", "1"],
        &["TB.ADJUST", "secret:bucket", "10", "1", "5"],
        &[
            "TB.MCONSUME",
            "rl:ok",
            "10",
            "0.01",
            "1",
            "secret:x",
            "10",
            "1",
            "1",
        ],
        &[
            "TB.MCONSUME",
            "secret:x",
            "10",
            "1",
            "1",
            "rl:ok",
            "10",
            "0.01",
            "1",
        ],
        &["HGETALL", "rl:ok"],
    ];
    for args in denied {
        let err = error_of(&mut c, redis::cmd(args[0]).arg(&args[1..]));
        assert!(err.starts_with("NOPERM"), "{args:?}: {err}");
    }
    assert_eq!(snapshot(&mut admin), before, "denied calls changed nothing");
}

/// Key permissions by access (`%R~`, `%W~`, Redis >= 7.0): the key specs
/// let a read-only user peek, and only a user who may read and write a
/// bucket charge or adjust it.
#[test]
fn read_only_key_permission_allows_peek_and_nothing_else() {
    let s = Server::start();
    let mut admin = s.conn();
    let user = |name: &str, keys: &str| s.conn_limited(name, keys, &BUCKET_COMMANDS);
    let mut reader = user("reader", "%R~rl:*");
    let mut writer = user("writer", "%W~rl:*");
    let mut both = user("both", "%RW~rl:*");
    assert_eq!(consume(&mut admin, "rl:k", "10", "1", "3"), [1, 7, 0, 3000]);
    let before = snapshot(&mut admin);

    assert_eq!(peek(&mut reader, "rl:k", "10", "1", "1")[..2], [1, 7]);
    let q: Vec<i64> = redis::cmd("TB.QPEEK")
        .arg(&["rl:q", "10", "DAY"])
        .query(&mut reader)
        .unwrap();
    assert_eq!(q, [1, 10, 0, 0]);
    let writes: [&[&str]; 7] = [
        &["TB.CONSUME", "rl:k", "10", "1"],
        &["TB.QUOTA", "rl:q", "10", "DAY"],
        &["TB.QADJUST", "rl:q", "10", "DAY", "-1"],
        &["TB.CHARGE", "1", "rl:q", "QUOTA", "10", "DAY", "1"],
        &["TB.ADJUST", "rl:k", "10", "1", "1"],
        &["TB.MCONSUME", "rl:k", "10", "1", "1"],
        &["CL.THROTTLE", "rl:k", "9", "1", "1"],
    ];
    for c in [&mut reader, &mut writer] {
        for args in writes {
            let err = error_of(c, redis::cmd(args[0]).arg(&args[1..]));
            assert!(err.starts_with("NOPERM"), "{args:?}: {err}");
        }
    }
    // Peeking reads the bucket: a write-only user may not.
    let err = error_of(&mut writer, redis::cmd("TB.PEEK").arg(&["rl:k", "10", "1"]));
    assert!(err.starts_with("NOPERM"), "{err}");
    assert_eq!(
        snapshot(&mut admin),
        before,
        "refused calls changed nothing"
    );
    assert_eq!(consume(&mut both, "rl:k", "10", "1", "1")[..2], [1, 6]);
}

#[test]
fn acl_categories_where_the_server_supports_them() {
    let s = Server::start();
    let mut c = s.conn();
    let categories = |c: &mut redis::Connection, cat: &str| -> Vec<String> {
        redis::cmd("ACL").arg("CAT").arg(cat).query(c).unwrap()
    };
    let info: Vec<redis::Value> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("tb.consume")
        .query(&mut c)
        .unwrap();
    let redis::Value::Array(entry) = &info[0] else {
        panic!("{info:?}")
    };
    let declared: Vec<String> = redis::from_redis_value(&entry[6]).unwrap_or_default();
    let version = info_field(&mut c, "server", "redis_version");
    let (major, minor) = {
        let mut p = version.split('.').map(|x| x.parse::<u32>().unwrap_or(0));
        (p.next().unwrap_or(0), p.next().unwrap_or(0))
    };
    if (major, minor) < (7, 2) {
        // Redis 7.0 has no module ACL category API: loaded all the same.
        assert!(declared.is_empty(), "{declared:?}");
        return;
    }
    assert!(declared.contains(&"@write".to_string()) && declared.contains(&"@fast".to_string()));
    let write = categories(&mut c, "write");
    let read = categories(&mut c, "read");
    let fast = categories(&mut c, "fast");
    for cmd in [
        "tb.consume",
        "tb.mconsume",
        "tb.adjust",
        "cl.throttle",
        "tb.quota",
        "tb.qadjust",
        "tb.charge",
        "tb.acquire",
        "tb.release",
        "tb.renew",
    ] {
        assert!(write.contains(&cmd.to_string()), "{cmd} in @write");
        assert!(!read.contains(&cmd.to_string()), "{cmd} not in @read");
    }
    for cmd in ["tb.peek", "tb.qpeek", "tb.inflight"] {
        assert!(read.contains(&cmd.to_string()), "{cmd} in @read");
        assert!(!write.contains(&cmd.to_string()), "{cmd} not in @write");
    }
    for cmd in [
        "tb.consume",
        "tb.peek",
        "tb.adjust",
        "cl.throttle",
        "tb.quota",
        "tb.qpeek",
        "tb.qadjust",
    ] {
        assert!(fast.contains(&cmd.to_string()), "{cmd} in @fast");
    }
    for cmd in ["tb.mconsume", "tb.charge", "tb.acquire"] {
        assert!(
            !fast.contains(&cmd.to_string()),
            "{cmd}: up to 10,000 keys is not fast"
        );
    }
    for cmd in ["tb.acquire", "tb.release", "tb.renew", "tb.inflight"] {
        // Each reads every lease of its key: O(N), not Redis's "fast".
        assert!(
            !fast.contains(&cmd.to_string()),
            "{cmd}: a scan of the key's leases is not fast"
        );
    }
}
