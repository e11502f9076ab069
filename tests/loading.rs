//! Loading the module and its one argument, `cl-throttle auto|off`, in a
//! config file, on the command line and with `MODULE LOAD`: MODULE LIST
//! shows the arguments, `auto` (the default) answers CL.THROTTLE unless
//! redis-cell has it, `off` leaves the name free for redis-cell loaded
//! after this module, and anything else refuses the load with a log line
//! naming it. (MODULE LIST's name and version are checked in
//! registration.rs.)

use testkit::{
    consume, fake_redis_cell, hgetall, module_path, peek, start_fails, tb_module_field, Config,
    Server,
};

/// The `args` MODULE LIST shows for the module named `tb`.
fn listed_args(c: &mut redis::Connection) -> Vec<String> {
    redis::from_redis_value(&tb_module_field(c, "args")).unwrap()
}

/// The TB commands answer as they do when loaded without arguments.
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

/// The reply of `CL.THROTTLE k 1 1 1`, or its error.
fn throttle(c: &mut redis::Connection) -> Result<redis::Value, String> {
    redis::cmd("CL.THROTTLE")
        .arg(&["cl", "1", "1", "1"])
        .query(c)
        .map_err(|e| e.to_string())
}

fn path() -> String {
    module_path().to_string_lossy().into_owned()
}

#[test]
fn cl_throttle_auto_on_the_command_line_answers_it() {
    let s = Server::with(
        Config::without_module().arg("loadmodule", &format!("{} CL-Throttle AUTO", path())),
    );
    let mut c = s.conn();
    assert_eq!(listed_args(&mut c), ["CL-Throttle", "AUTO"]);
    serves(&mut c);
    let reply = throttle(&mut c).expect("CL.THROTTLE");
    assert_eq!(
        redis::from_redis_value::<Vec<i64>>(&reply).unwrap()[..3],
        [0, 2, 1]
    );
}

#[test]
fn cl_throttle_off_in_a_config_file_leaves_it_unregistered() {
    // A redis.conf line, read through `include` (the harness passes its own
    // settings on the command line).
    let dir = std::env::temp_dir().join(format!("tb-loading-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("redis.conf");
    std::fs::write(&conf, format!("loadmodule {} cl-throttle off\n", path())).unwrap();
    let s = Server::with(Config::without_module().arg("include", &conf.to_string_lossy()));
    let mut c = s.conn();
    assert_eq!(listed_args(&mut c), ["cl-throttle", "off"]);
    serves(&mut c);
    let err = throttle(&mut c).expect_err("no CL.THROTTLE");
    assert!(err.contains("unknown command"), "{err}");
    assert!(s
        .log()
        .contains("tb: cl.throttle not registered (cl-throttle off)"));
    drop(s);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_wrong_argument_refuses_the_load_and_names_it() {
    for (args, said) in [
        (
            "max 10",
            "a module argument must be one of cl-throttle (given: max 10)",
        ),
        (
            "cl-throttle",
            "cl-throttle must be one of auto, off (given: cl-throttle)",
        ),
        (
            "cl-throttle maybe",
            "cl-throttle must be one of auto, off (given: cl-throttle maybe)",
        ),
        (
            "cl-throttle off extra",
            "cl-throttle must be one of auto, off (given: cl-throttle off extra)",
        ),
    ] {
        let log =
            start_fails(Config::without_module().arg("loadmodule", &format!("{} {args}", path())));
        assert!(
            log.contains(&format!("tb: {said}; not loading")),
            "{args}: {log}"
        );
    }
}

#[test]
fn module_load_with_arguments() {
    let s = Server::with(Config::without_module().arg("enable-module-command", "yes"));
    let mut c = s.conn();
    let err = redis::cmd("MODULE")
        .arg(&["LOAD", &path(), "cl-throttle", "sometimes"])
        .query::<String>(&mut c)
        .expect_err("a bad argument");
    assert!(err.to_string().contains("Error loading"), "{err}");
    assert!(tb_listed(&mut c).is_none(), "the module is not loaded");
    let ok: String = redis::cmd("MODULE")
        .arg(&["LOAD", &path(), "cl-throttle", "off"])
        .query(&mut c)
        .expect("MODULE LOAD with arguments");
    assert_eq!(ok, "OK");
    assert_eq!(listed_args(&mut c), ["cl-throttle", "off"]);
    serves(&mut c);
    assert!(throttle(&mut c).is_err());
}

/// MODULE UNLOAD gives back what the module kept between calls (the
/// `tokens` string of the last new bucket; the leak test watches that
/// under valgrind) and a second MODULE LOAD serves as the first did.
#[test]
fn unload_and_load_again() {
    let s = Server::with(Config::default().arg("enable-module-command", "yes"));
    let mut c = s.conn();
    // A new bucket keeps its balance's string.
    assert_eq!(consume(&mut c, "a", "10", "1", "1"), [1, 9, 0, 1000]);
    let ok: String = redis::cmd("MODULE")
        .arg(&["UNLOAD", "tb"])
        .query(&mut c)
        .expect("MODULE UNLOAD");
    assert_eq!(ok, "OK");
    assert!(tb_listed(&mut c).is_none(), "the module is unloaded");
    assert!(redis::cmd("TB.CONSUME")
        .arg(&["a", "10", "1", "1"])
        .query::<redis::Value>(&mut c)
        .is_err());
    // The bucket outlives the module: it is a plain hash.
    assert_eq!(hgetall(&mut c, "a")["tokens"], "9");
    let ok: String = redis::cmd("MODULE")
        .arg(&["LOAD", &path()])
        .query(&mut c)
        .expect("MODULE LOAD again");
    assert_eq!(ok, "OK");
    serves(&mut c);
    assert_eq!(consume(&mut c, "b", "10", "1", "1"), [1, 9, 0, 1000]);
    assert_eq!(hgetall(&mut c, "b")["tokens"], "9");
}

/// Whether MODULE LIST has a module named `tb`.
fn tb_listed(c: &mut redis::Connection) -> Option<()> {
    let list: Vec<std::collections::HashMap<String, redis::Value>> =
        redis::cmd("MODULE").arg("LIST").query(c).unwrap();
    list.iter()
        .any(|m| m.get("name") == Some(&redis::Value::BulkString(b"tb".to_vec())))
        .then_some(())
}

/// Load order with redis-cell (our stand-in of it, tests/fixtures): this
/// module first takes CL.THROTTLE, so redis-cell can't register it and the
/// server refuses to start; `cl-throttle off` leaves it to redis-cell.
/// (redis-cell first: tests/cl_throttle.rs.)
#[test]
fn redis_cell_after_this_module_needs_cl_throttle_off() {
    let cell = fake_redis_cell().to_string_lossy().into_owned();
    let log = start_fails(
        Config::without_module()
            .arg("loadmodule", &path())
            .arg("loadmodule", &cell),
    );
    assert!(log.contains("Module") && log.contains("failed"), "{log}");
    let s = Server::with(
        Config::without_module()
            .arg("loadmodule", &format!("{} cl-throttle off", path()))
            .arg("loadmodule", &cell),
    );
    let mut c = s.conn();
    let reply = throttle(&mut c).expect("redis-cell's CL.THROTTLE");
    assert_eq!(reply, redis::Value::SimpleString("fake redis-cell".into()));
    serves(&mut c);
}
