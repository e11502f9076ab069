//! Loading the module: it takes no arguments, and anything after its path
//! is ignored. `loadmodule path args...` in a config file or on the command
//! line, and `MODULE LOAD path args...` at run time, all load it; the
//! server hands it the arguments (MODULE LIST shows them) and it serves
//! exactly as without them. (MODULE LIST's name and version are checked in
//! registration.rs.)

use testkit::{consume, hgetall, module_path, peek, tb_module_field, Config, Server};

/// The `args` MODULE LIST shows for the module named `tb`.
fn listed_args(c: &mut redis::Connection) -> Vec<String> {
    redis::from_redis_value(&tb_module_field(c, "args")).unwrap()
}

/// The module answers as it does when loaded without arguments.
fn serves(c: &mut redis::Connection) {
    assert_eq!(consume(c, "k", "10", "1", "1"), [1, 9, 0, 1000]);
    assert_eq!(hgetall(c, "k")["tokens"], "9");
    assert_eq!(peek(c, "k", "10", "1", "9")[..3], [1, 9, 0]);
    let r: Vec<i64> = redis::cmd("TB.ADJUST")
        .arg(&["k", "10", "1", "-20"])
        .query(c)
        .unwrap();
    assert_eq!(r[..2], [1, -10]);
}

fn path() -> String {
    module_path().to_string_lossy().into_owned()
}

#[test]
fn arguments_on_the_command_line_are_ignored() {
    let s =
        Server::with(Config::without_module().arg("loadmodule", &format!("{} some args", path())));
    let mut c = s.conn();
    assert_eq!(listed_args(&mut c), ["some", "args"]);
    serves(&mut c);
}

#[test]
fn arguments_in_a_config_file_are_ignored() {
    // A redis.conf line, read through `include` (the harness passes its own
    // settings on the command line).
    let dir = std::env::temp_dir().join(format!("tb-loading-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("redis.conf");
    std::fs::write(
        &conf,
        format!("loadmodule {} max 10 rate nan --verbose\n", path()),
    )
    .unwrap();
    let s = Server::with(Config::without_module().arg("include", &conf.to_string_lossy()));
    let mut c = s.conn();
    assert_eq!(
        listed_args(&mut c),
        ["max", "10", "rate", "nan", "--verbose"]
    );
    serves(&mut c);
    drop(s);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn arguments_to_module_load_are_ignored() {
    let s = Server::with(Config::without_module().arg("enable-module-command", "yes"));
    let mut c = s.conn();
    let ok: String = redis::cmd("MODULE")
        .arg(&["LOAD", &path(), "one", "2", ""])
        .query(&mut c)
        .expect("MODULE LOAD with arguments");
    assert_eq!(ok, "OK");
    assert_eq!(listed_args(&mut c), ["one", "2", ""]);
    serves(&mut c);
}
