//! How the commands present themselves: key positions (GETKEYS, Cluster,
//! ACL), flags, and the INFO section.

use testkit::cluster::Cluster;
use testkit::{
    consume, error_of, info_field, out_of_memory, peek, run, start_replica, tb_counter,
    tb_module_field, Config, Server,
};

fn getkeys(c: &mut redis::Connection, args: &[&str]) -> Vec<String> {
    redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg(args)
        .query(c)
        .expect("COMMAND GETKEYS")
}

/// Each key of a command and its key-spec flags (COMMAND GETKEYSANDFLAGS).
fn flags_of(c: &mut redis::Connection, args: &[&str]) -> Vec<(String, Vec<String>)> {
    redis::cmd("COMMAND")
        .arg("GETKEYSANDFLAGS")
        .arg(args)
        .query(c)
        .unwrap_or_else(|e| panic!("COMMAND GETKEYSANDFLAGS {args:?}: {e}"))
}

/// A read-only key's flags, and a written one's.
fn read_flags() -> Vec<String> {
    vec!["RO".to_string(), "access".to_string()]
}

fn update_flags() -> Vec<String> {
    vec!["RW".to_string(), "access".to_string(), "update".to_string()]
}

/// TB.MCONSUME over three buckets: rl:u, rl:k and rl:i.
const MCONSUME: [&str; 13] = [
    "TB.MCONSUME",
    "rl:u",
    "10",
    "1",
    "1",
    "rl:k",
    "5",
    "1",
    "1",
    "rl:i",
    "9",
    "2",
    "0",
];

#[test]
fn getkeys_finds_every_key() {
    let s = Server::start();
    let mut c = s.conn();
    assert_eq!(
        getkeys(&mut c, &["TB.CONSUME", "rl:a", "10", "1"]),
        ["rl:a"]
    );
    assert_eq!(
        getkeys(&mut c, &["TB.CONSUME", "rl:a", "10", "1", "2"]),
        ["rl:a"]
    );
    assert_eq!(getkeys(&mut c, &["TB.PEEK", "rl:b", "10", "1"]), ["rl:b"]);
    assert_eq!(
        getkeys(&mut c, &["TB.ADJUST", "rl:c", "10", "1", "-3"]),
        ["rl:c"]
    );
    assert_eq!(getkeys(&mut c, &MCONSUME), ["rl:u", "rl:k", "rl:i"]);
    assert_eq!(
        getkeys(&mut c, &["CL.THROTTLE", "rl:d", "15", "30", "60", "1"]),
        ["rl:d"]
    );
}

#[test]
fn command_flags_match_the_contract() {
    let s = Server::start();
    let mut c = s.conn();
    let flags = |c: &mut redis::Connection, name: &str| -> Vec<String> {
        let info: Vec<redis::Value> = redis::cmd("COMMAND")
            .arg("INFO")
            .arg(name)
            .query(c)
            .unwrap();
        let redis::Value::Array(entry) = &info[0] else {
            panic!("{info:?}")
        };
        redis::from_redis_value(&entry[2]).unwrap()
    };
    let consume = flags(&mut c, "tb.consume");
    for f in ["write", "denyoom", "fast"] {
        assert!(consume.contains(&f.to_string()), "{consume:?}");
    }
    let peek = flags(&mut c, "tb.peek");
    assert!(peek.contains(&"readonly".to_string()) && peek.contains(&"fast".to_string()));
    assert!(!peek.contains(&"write".to_string()));
    assert!(flags(&mut c, "tb.mconsume").contains(&"write".to_string()));
    assert!(flags(&mut c, "tb.adjust").contains(&"write".to_string()));
    let cl = flags(&mut c, "cl.throttle");
    for f in ["write", "denyoom", "fast"] {
        assert!(cl.contains(&f.to_string()), "{cl:?}");
    }
    // The lease commands now and then read every lease of their key (a
    // pass): never "fast".
    for name in ["tb.acquire", "tb.release", "tb.renew", "tb.inflight"] {
        let f = flags(&mut c, name);
        assert!(!f.contains(&"fast".to_string()), "{name}: {f:?}");
    }
    assert!(flags(&mut c, "tb.inflight").contains(&"readonly".to_string()));
}

#[test]
fn info_counts_decisions_and_errors() {
    let s = Server::start();
    let mut c = s.conn();
    let field = tb_counter;
    assert_eq!(field(&mut c, "tb_admitted"), 0);
    consume(&mut c, "k", "2", "0.01", "1");
    consume(&mut c, "k", "2", "0.01", "1");
    consume(&mut c, "k", "2", "0.01", "1"); // denied
    peek(&mut c, "k", "2", "0.01", "1");
    let cl = |c: &mut redis::Connection| -> Vec<i64> {
        redis::cmd("CL.THROTTLE")
            .arg(&["cl", "0", "1", "100"])
            .query(c)
            .unwrap()
    };
    assert_eq!(cl(&mut c)[0], 0);
    assert_eq!(cl(&mut c)[0], 1, "denied");
    let _: Vec<redis::Value> = redis::cmd("TB.MCONSUME")
        .arg(&["a", "1", "1", "1", "b", "1", "1", "1"])
        .query(&mut c)
        .unwrap();
    let _: Vec<i64> = redis::cmd("TB.ADJUST")
        .arg(&["k", "2", "0.01", "1"])
        .query(&mut c)
        .unwrap();
    let _ = error_of(&mut c, redis::cmd("TB.CONSUME").arg(&["k", "x", "1"]));
    assert_eq!(field(&mut c, "tb_admitted"), 4);
    assert_eq!(field(&mut c, "tb_denied"), 2);
    assert_eq!(field(&mut c, "tb_peeks"), 1);
    assert_eq!(field(&mut c, "tb_adjusts"), 1);
    assert_eq!(field(&mut c, "tb_errors"), 1);
    assert_eq!(field(&mut c, "tb_panics"), 0);
    // Also listed in the full INFO, where redis_exporter scrapes it.
    let all: String = redis::cmd("INFO").arg("everything").query(&mut c).unwrap();
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        all.contains(&format!(
            "# tb\r\ntb_version:{version}\r\ntb_admitted:4\r\n"
        )),
        "{all}"
    );
}

/// `MODULE LIST` names the module `tb`, with the version of Cargo.toml
/// as major * 10000 + minor * 100 + patch.
#[test]
fn module_list_reports_the_name_and_version() {
    let s = Server::start();
    let mut c = s.conn();
    let parts: Vec<i64> = env!("CARGO_PKG_VERSION")
        .split('.')
        .map(|p| p.parse().unwrap())
        .collect();
    // Exactly one entry is named tb (the helper checks), with this version.
    let ver: i64 = redis::from_redis_value(&tb_module_field(&mut c, "ver")).unwrap();
    assert_eq!(ver, parts[0] * 10_000 + parts[1] * 100 + parts[2]);
    assert_eq!(
        info_field(&mut c, "tb", "tb_version"),
        env!("CARGO_PKG_VERSION")
    );
}

/// `COMMAND GETKEYSANDFLAGS`: the key specs set through SetCommandInfo.
/// Without them Redis derives full access from (first, last, step).
#[test]
fn key_specs_say_peek_reads_and_the_writers_update() {
    let s = Server::start();
    let mut c = s.conn();
    let (read, update) = (read_flags(), update_flags());
    assert_eq!(
        flags_of(&mut c, &["TB.PEEK", "rl:p", "10", "1"]),
        [("rl:p".to_string(), read)]
    );
    for args in [
        &["TB.CONSUME", "rl:a", "10", "1"][..],
        &["TB.CONSUME", "rl:a", "10", "1", "2"],
        &["TB.ADJUST", "rl:a", "10", "1", "-3"],
        &["CL.THROTTLE", "rl:a", "15", "30", "60"],
    ] {
        assert_eq!(
            flags_of(&mut c, args),
            [("rl:a".to_string(), update.clone())],
            "{args:?}"
        );
    }
    let m = flags_of(&mut c, &MCONSUME);
    assert_eq!(
        m,
        ["rl:u", "rl:k", "rl:i"].map(|k| (k.to_string(), update.clone()))
    );
}

/// The quota commands and TB.CHARGE: QPEEK's one key is read, the others'
/// read and updated. TB.CHARGE's keys are the `numkeys` after its count,
/// whatever follows them: WAIT's time, a quota's OFFSET and keys spelt
/// like the keywords are never taken for keys, or hide one.
#[test]
fn key_specs_of_the_quota_commands_and_charge() {
    let s = Server::start();
    let mut c = s.conn();
    let (read, update) = (read_flags(), update_flags());
    let each = |keys: &[&str], flags: &Vec<String>| -> Vec<(String, Vec<String>)> {
        keys.iter()
            .map(|k| (k.to_string(), flags.clone()))
            .collect()
    };
    for args in [
        &["TB.QPEEK", "rl:q", "10", "DAY"][..],
        &["TB.QPEEK", "rl:q", "10", "DAY", "2"],
        &["TB.QPEEK", "rl:q", "10", "MONTH", "OFFSET", "-300"],
        &["TB.QPEEK", "rl:q", "10", "3600", "2", "OFFSET", "330"],
    ] {
        assert_eq!(getkeys(&mut c, args), ["rl:q"], "{args:?}");
        assert_eq!(flags_of(&mut c, args), each(&["rl:q"], &read), "{args:?}");
    }
    for args in [
        &["TB.QUOTA", "rl:q", "10", "DAY"][..],
        &["TB.QUOTA", "rl:q", "10", "WEEK", "3"],
        &["TB.QUOTA", "rl:q", "10", "DAY", "OFFSET", "60"],
        &["TB.QUOTA", "rl:q", "10", "YEAR", "3", "OFFSET", "-60"],
        &["TB.QADJUST", "rl:q", "10", "DAY", "-3"],
        &["TB.QADJUST", "rl:q", "10", "DAY", "4", "OFFSET", "60"],
    ] {
        assert_eq!(getkeys(&mut c, args), ["rl:q"], "{args:?}");
        assert_eq!(flags_of(&mut c, args), each(&["rl:q"], &update), "{args:?}");
    }
    let charges: [(&[&str], &[&str]); 5] = [
        (
            &["TB.CHARGE", "1", "rl:b", "BUCKET", "10", "1", "1"],
            &["rl:b"],
        ),
        (
            &[
                "TB.CHARGE",
                "2",
                "rl:m",
                "rl:q",
                "BUCKET",
                "60",
                "1",
                "1",
                "QUOTA",
                "1000",
                "MONTH",
                "7",
            ],
            &["rl:m", "rl:q"],
        ),
        (
            &[
                "TB.CHARGE",
                "2",
                "rl:m",
                "rl:q",
                "WAIT",
                "250",
                "BUCKET",
                "60",
                "1",
                "1",
                "QUOTA",
                "1000",
                "MONTH",
                "7",
            ],
            &["rl:m", "rl:q"],
        ),
        // A quota clause with OFFSET before a bucket clause, under WAIT.
        (
            &[
                "TB.CHARGE",
                "3",
                "rl:q",
                "rl:m",
                "rl:d",
                "WAIT",
                "5000",
                "QUOTA",
                "1000",
                "DAY",
                "1",
                "OFFSET",
                "-300",
                "BUCKET",
                "60",
                "1",
                "1",
                "QUOTA",
                "10",
                "3600",
                "1",
            ],
            &["rl:q", "rl:m", "rl:d"],
        ),
        // Keys spelt like the keywords are keys, and only the counted ones.
        (
            &[
                "TB.CHARGE",
                "3",
                "WAIT",
                "QUOTA",
                "OFFSET",
                "WAIT",
                "9",
                "QUOTA",
                "5",
                "DAY",
                "1",
                "OFFSET",
                "60",
                "BUCKET",
                "5",
                "1",
                "1",
                "QUOTA",
                "5",
                "WEEK",
                "1",
            ],
            &["WAIT", "QUOTA", "OFFSET"],
        ),
    ];
    for (args, keys) in charges {
        assert_eq!(getkeys(&mut c, args), keys, "{args:?}");
        assert_eq!(flags_of(&mut c, args), each(keys, &update), "{args:?}");
    }
}

/// `COMMAND DOCS`: summary, since, complexity and typed arguments, which
/// redis-cli turns into hints as the user types.
#[test]
fn command_docs_describe_every_command() {
    let s = Server::start();
    let mut c = s.conn();
    // [name, [field, value, ...]], values nested the same way.
    fn field<'a>(doc: &'a [redis::Value], name: &str) -> &'a redis::Value {
        doc.chunks(2)
            .find(|kv| redis::from_redis_value::<String>(&kv[0]).ok().as_deref() == Some(name))
            .map(|kv| &kv[1])
            .unwrap_or_else(|| panic!("no {name} in {doc:?}"))
    }
    fn text(v: &redis::Value) -> String {
        redis::from_redis_value(v).unwrap()
    }
    fn list(v: &redis::Value) -> &[redis::Value] {
        match v {
            redis::Value::Array(a) => a,
            other => panic!("not an array: {other:?}"),
        }
    }
    // (name, type, optional) of each argument, blocks flattened.
    fn args(v: &redis::Value) -> Vec<(String, String, bool)> {
        let mut out = Vec::new();
        for a in list(v) {
            let a = list(a);
            let flags: Vec<String> = a
                .chunks(2)
                .find(|kv| text(&kv[0]) == "flags")
                .map(|kv| redis::from_redis_value(&kv[1]).unwrap())
                .unwrap_or_default();
            out.push((
                text(field(a, "name")),
                text(field(a, "type")),
                flags.contains(&"optional".to_string()),
            ));
            if let Some(sub) = a.chunks(2).find(|kv| text(&kv[0]) == "arguments") {
                out.extend(args(&sub[1]));
            }
        }
        out
    }
    let arg = |n: &str, t: &str, o: bool| (n.to_string(), t.to_string(), o);
    // key max rate, then the last argument: TB.MCONSUME's groups are a
    // block of the same four.
    let bucket = |last: &str, optional: bool| {
        vec![
            arg("key", "key", false),
            arg("max", "double", false),
            arg("rate", "double", false),
            arg(last, "double", optional),
        ]
    };
    // TB.CONSUME and TB.PEEK's optional WAIT max_ms.
    let waits = || [bucket("cost", true), vec![arg("max_ms", "integer", true)]].concat();
    // key limit period, the last argument, then OFFSET minutes.
    let quota = |last: &str, optional: bool| {
        vec![
            arg("key", "key", false),
            arg("limit", "double", false),
            arg("period", "string", false),
            arg(last, "double", optional),
            arg("minutes", "integer", true),
        ]
    };
    let expected = [
        ("tb.consume", waits()),
        ("tb.peek", waits()),
        ("tb.adjust", bucket("delta", false)),
        ("tb.quota", quota("cost", true)),
        ("tb.qpeek", quota("cost", true)),
        ("tb.qadjust", quota("delta", false)),
        (
            "tb.charge",
            vec![
                arg("numkeys", "integer", false),
                arg("key", "key", false),
                arg("max_ms", "integer", true),
                // One clause per key: BUCKET max rate cost or QUOTA limit
                // period cost [OFFSET minutes].
                arg("clause", "oneof", false),
                arg("bucket", "block", false),
                arg("max", "double", false),
                arg("rate", "double", false),
                arg("cost", "double", false),
                arg("quota", "block", false),
                arg("limit", "double", false),
                arg("period", "string", false),
                arg("cost", "double", false),
                arg("minutes", "integer", true),
            ],
        ),
        (
            "tb.mconsume",
            [vec![arg("bucket", "block", false)], bucket("cost", false)].concat(),
        ),
        (
            "cl.throttle",
            vec![
                arg("key", "key", false),
                arg("max_burst", "integer", false),
                arg("count", "integer", false),
                arg("period", "integer", false),
                arg("quantity", "integer", true),
            ],
        ),
        (
            "tb.acquire",
            vec![
                arg("key", "key", false),
                arg("limit", "integer", false),
                arg("lease_ms", "integer", false),
                arg("id", "string", false),
                arg("weight", "integer", true),
                // The clauses: optional, each a BUCKET block of bkey max
                // rate cost or a QUOTA block of qkey limit period cost
                // [OFFSET minutes].
                arg("clause", "oneof", true),
                arg("bucket", "block", false),
                arg("bkey", "key", false),
                arg("max", "double", false),
                arg("rate", "double", false),
                arg("cost", "double", false),
                arg("quota", "block", false),
                arg("qkey", "key", false),
                arg("limit", "double", false),
                arg("period", "string", false),
                arg("cost", "double", false),
                arg("minutes", "integer", true),
            ],
        ),
        (
            "tb.release",
            vec![arg("key", "key", false), arg("id", "string", false)],
        ),
        (
            "tb.renew",
            vec![
                arg("key", "key", false),
                arg("id", "string", false),
                arg("lease_ms", "integer", false),
            ],
        ),
        ("tb.inflight", vec![arg("key", "key", false)]),
    ];
    // Every command the module registered is in the list above.
    let mut registered: Vec<String> = redis::cmd("COMMAND")
        .arg(&["LIST", "FILTERBY", "MODULE", "tb"])
        .query(&mut c)
        .expect("COMMAND LIST FILTERBY MODULE");
    registered.sort();
    let mut listed: Vec<String> = expected.iter().map(|(n, _)| n.to_string()).collect();
    listed.sort();
    assert_eq!(registered, listed);
    for (name, want) in expected {
        let reply: Vec<redis::Value> = redis::cmd("COMMAND")
            .arg("DOCS")
            .arg(name)
            .query(&mut c)
            .expect("COMMAND DOCS");
        assert_eq!(reply.len(), 2, "{name}: {reply:?}");
        assert_eq!(text(&reply[0]), name);
        let doc = list(&reply[1]);
        assert!(!text(field(doc, "summary")).is_empty(), "{name}");
        assert_eq!(
            text(field(doc, "since")),
            env!("CARGO_PKG_VERSION"),
            "{name}"
        );
        assert!(text(field(doc, "complexity")).starts_with("O("), "{name}");
        assert_eq!(args(field(doc, "arguments")), want, "{name}");
    }
}

/// `tb_errors` counts the errors the module itself replies; errors Redis
/// raises before the module runs are not the module's and are not
/// counted: NOPERM, OOM and an unknown command here; CROSSSLOT, MOVED and
/// READONLY below.
#[test]
fn tb_errors_counts_only_the_modules_own_errors() {
    let s = Server::start();
    let mut c = s.conn();
    let errors = |c: &mut redis::Connection| tb_counter(c, "tb_errors");
    let mut limited = s.conn_as("other", &["~other:*", "+@all"]);
    let err = error_of(
        &mut limited,
        redis::cmd("TB.CONSUME").arg(&["rl:k", "10", "1"]),
    );
    assert!(err.starts_with("NOPERM"), "{err}");
    let err = error_of(&mut c, redis::cmd("TB.NOSUCH").arg(&["k", "10", "1"]));
    assert!(err.starts_with("ERR unknown command"), "{err}");
    out_of_memory(&mut c, 2 << 20);
    let err = error_of(&mut c, redis::cmd("TB.CONSUME").arg(&["k", "10", "1"]));
    assert!(err.starts_with("OOM"), "{err}");
    assert_eq!(errors(&mut c), 0);
    // The module's own: a bad argument, counted even under OOM.
    let err = error_of(&mut c, redis::cmd("TB.PEEK").arg(&["k", "x", "1"]));
    assert!(err.starts_with("ERR max"), "{err}");
    assert_eq!(errors(&mut c), 1);
}

/// Cluster and replica refusals come from Redis before the module runs:
/// `CROSSSLOT` (keys in several slots), `MOVED` (a key of another node's
/// slot) and `READONLY` (a writer on a replica) leave `tb_errors` at 0,
/// while the module's own error on the same node counts.
#[test]
fn tb_errors_leaves_out_cluster_and_replica_refusals() {
    let cluster = Cluster::start(3, 0, Config::default());
    let mut c = cluster.nodes[0].conn();
    // `a` and `b` hash to different slots.
    let err = error_of(
        &mut c,
        redis::cmd("TB.MCONSUME").arg(&["a", "10", "1", "1", "b", "10", "1", "1"]),
    );
    assert!(err.starts_with("CROSSSLOT"), "{err}");
    // A key of another node's slot, and one of this node's.
    let (mut moved, mut here) = (None, None);
    for i in 0..100 {
        let key = format!("k{i}");
        match run(
            &mut c,
            redis::cmd("TB.PEEK").arg(&[key.as_str(), "10", "1"]),
        ) {
            Err(e) if e.starts_with("MOVED") => moved = moved.or(Some(key)),
            Ok(_) => here = here.or(Some(key)),
            Err(e) => panic!("{key}: {e}"),
        }
    }
    let (moved, here) = (moved.expect("a MOVED key"), here.expect("a key of node 0"));
    let err = error_of(
        &mut c,
        redis::cmd("TB.CONSUME").arg(&[moved.as_str(), "x", "1"]),
    );
    assert!(err.starts_with("MOVED"), "{err}");
    assert_eq!(tb_counter(&mut c, "tb_errors"), 0);
    let err = error_of(
        &mut c,
        redis::cmd("TB.CONSUME").arg(&[here.as_str(), "x", "1"]),
    );
    assert!(err.starts_with("ERR max"), "{err}");
    assert_eq!(tb_counter(&mut c, "tb_errors"), 1);

    let primary = Server::start();
    let replica = start_replica(&primary, Config::default());
    let mut r = replica.conn();
    for args in [
        &["TB.CONSUME", "k", "10", "1"][..],
        &["TB.ADJUST", "k", "10", "1", "x"],
        &["CL.THROTTLE", "k", "1", "1", "1"],
    ] {
        let err = error_of(&mut r, redis::cmd(args[0]).arg(&args[1..]));
        assert!(err.starts_with("READONLY"), "{args:?}: {err}");
    }
    assert_eq!(tb_counter(&mut r, "tb_errors"), 0);
    let err = error_of(&mut r, redis::cmd("TB.PEEK").arg(&["k", "x", "1"]));
    assert!(err.starts_with("ERR max"), "{err}");
    assert_eq!(tb_counter(&mut r, "tb_errors"), 1);
}
