//! How the commands present themselves: key positions (GETKEYS, Cluster,
//! ACL), flags, and the INFO section.

mod common;
use common::*;

fn getkeys(c: &mut redis::Connection, args: &[&str]) -> Vec<String> {
    redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg(args)
        .query(c)
        .expect("COMMAND GETKEYS")
}

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
    assert_eq!(
        getkeys(
            &mut c,
            &[
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
                "0"
            ]
        ),
        ["rl:u", "rl:k", "rl:i"]
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
}

#[test]
fn info_counts_decisions_and_errors() {
    let s = Server::start();
    let mut c = s.conn();
    let field =
        |c: &mut redis::Connection, f: &str| -> u64 { info_field(c, "tb", f).parse().unwrap() };
    assert_eq!(field(&mut c, "tb_admitted"), 0);
    consume(&mut c, "k", "2", "0.01", "1");
    consume(&mut c, "k", "2", "0.01", "1");
    consume(&mut c, "k", "2", "0.01", "1"); // denied
    peek(&mut c, "k", "2", "0.01", "1");
    let _: Vec<redis::Value> = redis::cmd("TB.MCONSUME")
        .arg(&["a", "1", "1", "1", "b", "1", "1", "1"])
        .query(&mut c)
        .unwrap();
    let _: Vec<i64> = redis::cmd("TB.ADJUST")
        .arg(&["k", "2", "0.01", "1"])
        .query(&mut c)
        .unwrap();
    let _ = error_of(&mut c, redis::cmd("TB.CONSUME").arg(&["k", "x", "1"]));
    assert_eq!(field(&mut c, "tb_admitted"), 3);
    assert_eq!(field(&mut c, "tb_denied"), 1);
    assert_eq!(field(&mut c, "tb_peeks"), 1);
    assert_eq!(field(&mut c, "tb_adjusts"), 1);
    assert_eq!(field(&mut c, "tb_errors"), 1);
    assert_eq!(field(&mut c, "tb_panics"), 0);
    // Also listed in the full INFO, where redis_exporter scrapes it.
    let all: String = redis::cmd("INFO").arg("everything").query(&mut c).unwrap();
    assert!(all.contains("# tb\r\ntb_admitted:3"), "{all}");
}
