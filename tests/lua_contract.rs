//! The Lua fallback on servers without the module: the Functions library
//! on Redis 7 (Debian's redis-server, or `TB_REDIS_SERVER`) and the EVAL
//! scripts on Redis 7 and Redis 6.2.
//!
//! Exact arithmetic on a fake clock is in `lua_vectors.rs` and
//! `lua_differential.rs`; this file checks what needs a live server:
//! replication, what is (not) written, errors, limits, script caching, and
//! that the committed EVAL scripts are generated from `lua/tb.lua`.

use redis::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use testkit::{
    bad_then_expired, dbsize, error_of, eval_script, expired_keys, hgetall, info_field, int,
    lazy_expiry_only, load_eval_script, load_library, out_of_memory, pypi_server, repl_offset, run,
    server_time_us, snapshot, start_replica, wait_replicas, Config, KeyView, Pypi, Server, LIBRARY,
};

const SHARED_BEGIN: &str = "-- >>> shared: begin\n";
/// The library's operations, in the order it lists them.
const OPERATIONS: [&str; 13] = [
    "consume",
    "peek",
    "mconsume",
    "adjust",
    "cl_throttle",
    "acquire",
    "release",
    "renew",
    "inflight",
    "quota",
    "qpeek",
    "qadjust",
    "charge",
];
const SHARED_END: &str = "-- <<< shared: end\n";

/// `FCALL name numkeys keys... args...` (FCALL_RO for tb_peek and
/// tb_inflight).
fn fcall_cmd(function: &str, keys: &[&[u8]], args: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd(if function == "tb_peek" || function == "tb_inflight" {
        "FCALL_RO"
    } else {
        "FCALL"
    });
    cmd.arg(function).arg(keys.len()).arg(keys).arg(args);
    cmd
}

fn fcall(c: &mut redis::Connection, function: &str, keys: &[&str], args: &[&str]) -> Vec<i64> {
    let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
    fcall_cmd(function, &keys, args)
        .query(c)
        .unwrap_or_else(|e| panic!("{function} {keys:?} {args:?}: {e}"))
}

/// Caches the EVAL script on the server (SCRIPT LOAD).
fn load_scripts(c: &mut redis::Connection) {
    load_eval_script(c);
}

/// `EVALSHA sha numkeys keys... op args...`: a library function through
/// the EVAL script (`tb_consume` is operation `consume`).
fn evalsha_cmd(function: &str, keys: &[&[u8]], args: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(redis::Script::new(eval_script()).get_hash())
        .arg(keys.len())
        .arg(keys)
        .arg(function.strip_prefix("tb_").unwrap_or(function))
        .arg(args);
    cmd
}

fn dirty(c: &mut redis::Connection) -> String {
    info_field(c, "persistence", "rdb_changes_since_last_save")
}

/// Builds a call of a library function (`tb_x`) on keys with arguments.
type CmdOf = fn(&str, &[&[u8]], &[&str]) -> redis::Cmd;

/// The library's two forms on a server without the module.
const FORMS: [(&str, CmdOf); 2] = [("FCALL", fcall_cmd), ("EVALSHA", evalsha_cmd)];

/// A connection to `s` with the library loaded and the EVAL script cached.
fn library_conn(s: &Server) -> redis::Connection {
    let mut c = s.conn();
    load_library(&mut c);
    load_scripts(&mut c);
    c
}

/// `HSET key field value ...`, written by hand.
fn hset(c: &mut redis::Connection, key: &str, fields: &[&str]) {
    let _: () = redis::cmd("HSET").arg(key).arg(fields).query(c).unwrap();
}

/// The EVAL script itself (`verb`: EVAL or EVAL_RO) on one key.
fn eval_cmd(verb: &str, key: &str, words: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd(verb);
    cmd.arg(eval_script()).arg(1).arg(key).arg(words);
    cmd
}

// ---- the generated EVAL scripts ---------------------------------------------

fn shared_block(source: &str) -> &str {
    let start = source.find(SHARED_BEGIN).expect("begin marker") + SHARED_BEGIN.len();
    let end = source.find(SHARED_END).expect("end marker");
    &source[start..end]
}

/// The block with its numeric constants (`local NAME = <number>` lines:
/// the contract's limits, TINY) written in where code uses them, as the
/// EVAL script has it: every identifier NAME outside strings and comments
/// becomes the number; the definitions stay.
fn constants_written_in(block: &str) -> String {
    let mut values = BTreeMap::new();
    for line in block.lines() {
        let Some((name, value)) = line
            .strip_prefix("local ")
            .and_then(|l| l.split_once(" = "))
        else {
            continue;
        };
        let upper = name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        if upper && value.parse::<f64>().is_ok() {
            values.insert(name.to_string(), value.to_string());
        }
    }
    assert!(
        values.contains_key("MAX_WAIT_MS") && values.contains_key("TINY"),
        "{values:?}"
    );
    let mut out = String::new();
    for line in block.split_inclusive('\n') {
        let defines = line
            .strip_prefix("local ")
            .and_then(|l| l.split_once(" = "))
            .is_some_and(|(name, _)| values.contains_key(name));
        if defines {
            out.push_str(line);
            continue;
        }
        let chars: Vec<char> = line.chars().collect();
        let (mut i, mut quote) = (0, None);
        while i < chars.len() {
            let c = chars[i];
            if let Some(q) = quote {
                out.push(c);
                if c == '\\' && i + 1 < chars.len() {
                    out.push(chars[i + 1]);
                    i += 1;
                } else if c == q {
                    quote = None;
                }
                i += 1;
            } else if c == '\'' || c == '"' {
                quote = Some(c);
                out.push(c);
                i += 1;
            } else if c == '-' && chars.get(i + 1) == Some(&'-') {
                out.extend(&chars[i..]);
                break;
            } else if c.is_ascii_alphanumeric() || c == '_' {
                let start = i;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                out.push_str(values.get(&word).unwrap_or(&word));
            } else {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

#[test]
fn the_eval_script_is_the_shared_block_and_a_dispatcher() {
    // Independently of the generator: the library's shared block, byte for
    // byte but for its numeric constants written in where they are used
    // (an upvalue costs every EVAL), then a dispatcher on the first
    // argument, and nothing that only a library may do.
    let script = eval_script();
    let library_block = shared_block(LIBRARY);
    assert!(library_block.contains("if ms > MAX_WAIT_MS then ms = MAX_WAIT_MS end"));
    let block = &constants_written_in(library_block);
    assert!(block.contains("if ms > 100000000000000 then ms = 100000000000000 end"));
    assert!(!script.contains("MAX_WAIT_MS then"));
    assert!(block.contains("local function tb_mconsume(keys, args)"));
    // The EVAL script makes msg()'s table on each call (every EVAL starts
    // afresh, so the library's memo of it would be an upvalue for nothing).
    let mut block = block.clone();
    for (memo, local) in [
        ("local MSG\n", ""),
        ("  if not MSG then\n    MSG = {\n", "  local MSG = {\n"),
        ("\n    }\n  end\n", "\n    }\n"),
    ] {
        assert_eq!(block.matches(memo).count(), 1, "{memo}");
        block = block.replacen(memo, local, 1);
    }
    // Consume and peek are answered at the early-dispatch line, before the
    // rest of the block is defined, by consume_or_peek's body and those of
    // the functions it calls once, run in place: each of those functions
    // moves to just below the answer, where the other operations call it;
    // the block is otherwise the same.
    let (mut head, rest) = block
        .split_once("-- >>> eval: early dispatch\n")
        .map(|(h, r)| (h.to_string(), r))
        .expect("the early-dispatch line");
    assert!(!rest.contains("-- >>> eval: early dispatch"));
    let mut moved = Vec::new();
    let mut bodies = Vec::new();
    for (name, params) in [
        ("consume_or_peek", "op, keys, args, i"),
        ("parse_limits", "max_s, rate_s, cost_s, g"),
        ("parse_i64", "s"),
        ("load", "key, g"),
        ("two_fields", "key, a, b, bad, g"),
        ("reserve", "l, stored, now, cur, cost, max_ms, charging"),
        ("charge", "l, stored, now, cur, cost, charging"),
        ("save", "key, existed, l, tokens, reset, now"),
        ("clock", ""),
        ("parse_decimal", "s"),
        ("current_at", "l, stored, hi, lo"),
        ("charges_nothing", "cost, max"),
    ] {
        let def = format!("local function {name}({params})\n");
        let start = head
            .find(&def)
            .unwrap_or_else(|| panic!("{def} before the line"));
        let end = start + head[start..].find("\nend\n").expect("its end") + "\nend\n".len();
        let function = head[start..end].to_string();
        bodies.push(function[def.len()..function.len() - "end\n".len()].to_string());
        moved.push((block.find(&function).expect("in the block"), function));
        head.replace_range(start..end, "");
    }
    // They move in the block's order.
    moved.sort();
    let moved: String = moved.into_iter().map(|(_, f)| f).collect();
    // Above the line: the rest of the block, in order, but its calls of
    // those functions (ms_from's of current_at), which run in place too.
    let at = script
        .find(head.lines().next().expect("a first line"))
        .expect("the block's first line");
    let early_at = at
        + script[at..]
            .find("\nif ARGV[1] == 'consume' or ARGV[1] == 'peek' then\n")
            .expect("the early dispatch");
    let script_head = &script[at..early_at];
    let inlined = [
        "parse_limits(",
        "parse_i64(",
        "load(",
        "two_fields(",
        "reserve(",
        "charges_nothing(",
        "charge(",
        "save(",
        "clock(",
        "parse_decimal(",
        "current_at(",
    ];
    let calls_inlined = |line: &str| {
        let code = line.split("--").next().unwrap_or("");
        inlined.iter().any(|f| code.contains(f))
    };
    let mut from = 0;
    for line in head.lines().filter(|l| !calls_inlined(l)) {
        let found = script_head[from..].find(line);
        assert!(found.is_some(), "{line:?} in order in {script_head}");
        from += found.unwrap_or(0) + line.len();
    }
    assert!(!script_head.lines().any(calls_inlined), "{script_head}");
    assert!(script_head.contains("local l, stored, hi, lo = l, stored, now.hi + h, "));
    let after = &script[early_at..];
    let early_end = after
        .find(&format!("{moved}{rest}"))
        .expect("the functions run at the early dispatch, then the block after it");
    let early = &after[..early_end];
    for needed in [
        "redis.replicate_commands()",
        "if ARGV[1] == 'consume' or ARGV[1] == 'peek' then",
        "  local op, keys, args, i = ARGV[1], KEYS, ARGV, 2\n",
        "  local max_s, rate_s, cost_s, g = args[i], args[i + 1], (n == 3 or not wait) and args[i + 2] or nil\n",
        "  local key, g = keys[1]\n",
    ] {
        assert!(early.contains(needed), "{needed} in {early}");
    }
    // Every line of each body is there, in order, but its returns (now
    // assignments and a break out of `repeat ... until true`) and its calls
    // of the functions run in place; and the answer defines no function.
    for body in &bodies {
        let mut from = 0;
        for line in body.lines() {
            let code = line.split("--").next().unwrap_or("");
            if code.contains("return") || calls_inlined(line) {
                continue;
            }
            let found = early[from..].find(line);
            assert!(found.is_some(), "{line:?} in order in {early}");
            from += found.unwrap_or(0) + line.len();
        }
    }
    assert!(
        !early
            .lines()
            .any(|l| l.split("--").next().unwrap_or("").contains("function")),
        "{early}"
    );
    assert_eq!(early.matches("until true\n").count(), 15, "{early}");
    let tail = &after[early_end + moved.len() + rest.len()..];
    assert!(tail.contains("redis.replicate_commands()"), "{tail}");
    assert!(tail.contains("OPERATIONS[i + 1](KEYS, ARGV)"), "{tail}");
    assert!(!script.contains("register_function") && !script.contains("#!lua"));
    // Every operation the library registers, the script dispatches to: one
    // list in the block serves both.
    for op in OPERATIONS {
        assert!(block.contains(&format!("\n  '{op}', tb_{op}, '")), "{op}");
    }
    // The help text names them all, and how tb_acquire's clause keys go.
    let help = &script[..at];
    assert!(help.contains(&OPERATIONS.join(", ")), "{help}");
    assert!(
        help.contains("EVALSHA <sha> 1+N key key1..keyN acquire limit lease_ms id [weight]"),
        "{help}"
    );
    assert!(
        help.contains("peek, inflight and qpeek on Redis >= 7"),
        "{help}"
    );
    assert!(!LIBRARY[LIBRARY.find(SHARED_END).unwrap()..].contains("'tb_consume'"));
}

#[test]
fn generator_check_tells_a_stale_script() {
    // A scratch copy of lua/: --check passes on what the generator wrote,
    // and fails once the library changed until it runs again.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("tb-gen-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(root.join("lua/gen_eval.py"), dir.join("gen_eval.py")).unwrap();
    std::fs::write(dir.join("tb.lua"), LIBRARY).unwrap();
    let out = dir.join("out/tb-eval.lua");
    let gen = |args: &[&std::ffi::OsStr]| {
        Command::new("python3")
            .arg(dir.join("gen_eval.py"))
            .args(args)
            .output()
            .expect("python3")
            .status
            .success()
    };
    let check = [std::ffi::OsStr::new("--check"), out.as_os_str()];
    assert!(!gen(&check), "a missing script passes --check");
    assert!(gen(&[out.as_os_str()]));
    assert!(gen(&check));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), eval_script());
    let edited = LIBRARY.replace(
        "local MAX_GROUPS = 10000\n",
        "local MAX_GROUPS = 10000\n-- an edit\n",
    );
    assert_ne!(edited, LIBRARY);
    std::fs::write(dir.join("tb.lua"), &edited).unwrap();
    assert!(!gen(&check), "a stale script passes --check");
    assert!(gen(&[out.as_os_str()]));
    assert!(gen(&check));
    assert!(std::fs::read_to_string(&out)
        .unwrap()
        .contains("-- an edit\n"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_eval_script_refuses_an_unknown_operation() {
    let s = Server::with(Config::without_module());
    let mut c = s.conn();
    let sha = load_eval_script(&mut c);
    for args in [&["1", "k", "consumer", "10", "1"][..], &["0"]] {
        let err = error_of(&mut c, redis::cmd("EVALSHA").arg(&sha).arg(args));
        assert!(
            err.contains("unknown operation")
                && err.ends_with(&format!("one of {}", OPERATIONS.join(", "))),
            "{err}"
        );
    }
}

// ---- the library -----------------------------------------------------------

#[test]
fn library_registers_its_functions_and_peek_is_read_only() {
    let s = Server::with(Config::without_module());
    let mut c = library_conn(&s);
    // Loading again replaces the library (REPLACE), as an upgrade does.
    load_library(&mut c);
    let list: Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg("tb")
        .query(&mut c)
        .unwrap();
    let text = format!("{list:?}");
    let flags = function_flags(&list);
    let mut names: Vec<String> = OPERATIONS.iter().map(|op| format!("tb_{op}")).collect();
    names.push("tb_version".into());
    names.sort();
    assert_eq!(flags.keys().cloned().collect::<Vec<_>>(), names, "{text}");
    // Read-only: tb_peek, tb_inflight and tb_version. TB.RELEASE and
    // TB.RENEW have no deny-oom, so their functions allow OOM; the other
    // writers have no flag (Redis refuses them under OOM, as deny-oom).
    for (f, expected) in &flags {
        let want: &[&str] = match f.as_str() {
            "tb_peek" | "tb_qpeek" | "tb_inflight" | "tb_version" => &["no-writes"],
            "tb_release" | "tb_renew" => &["allow-oom"],
            _ => &[],
        };
        assert_eq!(expected, want, "{f}");
    }
    // The version contract/gen.py stamped into the library: the package's,
    // then a hash of the library's code.
    let version: String = redis::cmd("FCALL_RO")
        .arg(&["tb_version", "0"])
        .query(&mut c)
        .unwrap();
    let source = std::fs::read_to_string(testkit::root().join("lua/tb.lua")).unwrap();
    assert!(
        source.contains(&format!("local LIBRARY_VERSION = '{version}'\n")),
        "{version}"
    );
    let (package, hash) = version.split_once('+').expect("version+hash");
    assert_eq!(package, env!("CARGO_PKG_VERSION"));
    assert!(
        hash.len() == 12 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
        "{hash}"
    );

    let mut ro = redis::cmd("FCALL_RO");
    ro.arg("tb_consume").arg(1).arg("k").arg(10).arg(1);
    assert!(
        error_of(&mut c, &ro).contains("write flag"),
        "FCALL_RO runs only no-writes functions"
    );
    assert_eq!(
        fcall(&mut c, "tb_peek", &["k"], &["10", "1"]),
        [1, 10, 0, 0]
    );
    let mut ro = redis::cmd("FCALL_RO");
    ro.arg(&["tb_acquire", "1", "k", "1", "1000", "id"]);
    assert!(error_of(&mut c, &ro).contains("write flag"));
    let inflight = run(&mut c, &fcall_cmd("tb_inflight", &[b"k"], &[]));
    assert_eq!(inflight, Ok(Value::Int(0)));
    assert_eq!(int(&mut c, "EXISTS", "k"), 0);
}

/// Each function of FUNCTION LIST and its flags.
fn function_flags(list: &Value) -> BTreeMap<String, Vec<String>> {
    let text = |v: &Value| redis::from_redis_value::<String>(v).unwrap();
    let field = |v: &Value, name: &str| -> Value {
        let Value::Array(kv) = v else { panic!("{v:?}") };
        kv.chunks(2)
            .find(|p| text(&p[0]) == name)
            .map(|p| p[1].clone())
            .unwrap_or_else(|| panic!("no {name} in {v:?}"))
    };
    let Value::Array(libraries) = list else {
        panic!("{list:?}")
    };
    assert_eq!(libraries.len(), 1, "{list:?}");
    let Value::Array(functions) = field(&libraries[0], "functions") else {
        panic!("{list:?}")
    };
    functions
        .iter()
        .map(|f| {
            let flags: Vec<String> = redis::from_redis_value(&field(f, "flags")).unwrap();
            (text(&field(f, "name")), flags)
        })
        .collect()
}

#[test]
fn admitted_call_writes_the_bucket_and_replicates_it() {
    let s = Server::with(Config::without_module());
    let replica = start_replica(&s, Config::without_module());
    let mut c = s.conn();
    load_library(&mut c);
    let t: Vec<i64> = redis::cmd("TIME").query(&mut c).unwrap();
    let before_us = t[0] * 1_000_000 + t[1];

    assert_eq!(
        fcall(&mut c, "tb_consume", &["k"], &["10", "0.001", "1"]),
        [1, 9, 0, 1_000_000]
    );
    let h = hgetall(&mut c, "k");
    assert_eq!(h.keys().collect::<Vec<_>>(), ["tokens", "ts"], "{h:?}");
    assert_eq!(h["tokens"], "9");
    let ts: i64 = h["ts"].parse().expect("ts is an integer");
    assert!(ts >= before_us, "ts {ts} is the server clock in µs");
    // Expires when full again: ceil(ts / 1000) + reset_after_ms.
    let at = int(&mut c, "PEXPIRETIME", "k");
    assert_eq!(at, (ts + 999) / 1000 + 1_000_000);

    // The replica got the library (FUNCTION LOAD replicates) and the
    // bucket's effects: the same hash and expiry, not a recomputation.
    wait_replicas(&mut c, 1);
    let mut r = replica.conn();
    assert_eq!(hgetall(&mut r, "k"), h);
    assert_eq!(int(&mut r, "PEXPIRETIME", "k"), at);
    // tb_peek runs on the replica; writes are refused there.
    let p = fcall(&mut r, "tb_peek", &["k"], &["10", "0.001", "1"]);
    assert_eq!(p[..3], [1, 9, 0]);
    assert!(p[3] <= 1_000_000, "{p:?}");
    let write = fcall_cmd("tb_consume", &[b"k"], &["10", "0.001", "1"]);
    assert!(error_of(&mut r, &write).starts_with("READONLY"));
    assert_eq!(hgetall(&mut r, "k"), h);
}

/// Calls that must fail, each with its error: (function, keys, args).
fn bad_calls() -> Vec<(&'static str, Vec<&'static str>, Vec<&'static str>, String)> {
    let arity = |f: &str| format!("ERR wrong number of arguments for '{f}' command");
    let nan = |a: &str| format!("ERR {a} must be a finite decimal number");
    let mut calls = vec![
        // Arity, including the number of keys.
        ("tb_consume", vec![], vec!["10", "1"], arity("tb_consume")),
        (
            "tb_consume",
            vec!["k", "k2"],
            vec!["10", "1"],
            arity("tb_consume"),
        ),
        ("tb_consume", vec!["k"], vec!["10"], arity("tb_consume")),
        (
            "tb_consume",
            vec!["k"],
            vec!["10", "1", "1", "1", "1", "1"],
            arity("tb_consume"),
        ),
        ("tb_peek", vec!["k"], vec![], arity("tb_peek")),
        ("tb_adjust", vec!["k"], vec!["10", "1"], arity("tb_adjust")),
        (
            "tb_adjust",
            vec![],
            vec!["10", "1", "1"],
            arity("tb_adjust"),
        ),
        ("tb_mconsume", vec![], vec![], arity("tb_mconsume")),
        (
            "tb_mconsume",
            vec!["a"],
            vec!["1", "1"],
            arity("tb_mconsume"),
        ),
        (
            "tb_mconsume",
            vec!["a", "b"],
            vec!["1", "1", "1", "1"],
            arity("tb_mconsume"),
        ),
        (
            "tb_mconsume",
            vec!["a"],
            vec!["1", "1", "1", "1"],
            arity("tb_mconsume"),
        ),
        // Numbers: the strict grammar, then the bounds, in argument order.
        ("tb_consume", vec!["k"], vec!["ten", "1"], nan("max")),
        ("tb_consume", vec!["k"], vec!["NaN", "1"], nan("max")),
        ("tb_consume", vec!["k"], vec!["0x10", "1"], nan("max")),
        ("tb_consume", vec!["k"], vec!["10 ", "1"], nan("max")),
        ("tb_consume", vec!["k"], vec!["\t10", "1"], nan("max")),
        ("tb_consume", vec!["k"], vec!["1e999", "1"], nan("max")),
        ("tb_consume", vec!["k"], vec!["", "1"], nan("max")),
        ("tb_consume", vec!["k"], vec!["10\u{0}", "1"], nan("max")),
        (
            "tb_consume",
            vec!["k"],
            vec!["-0", "1"],
            "ERR max must be > 0 and <= 1e12".into(),
        ),
        ("tb_consume", vec!["k"], vec!["10", "infinity"], nan("rate")),
        ("tb_consume", vec!["k"], vec!["10", "-inf"], nan("rate")),
        ("tb_consume", vec!["k"], vec!["10", "1e12.5"], nan("rate")),
        (
            "tb_consume",
            vec!["k"],
            vec!["10", "1.5e13"],
            "ERR rate must be > 0 and <= 1e12".into(),
        ),
        (
            "tb_consume",
            vec!["k"],
            vec!["1e11", "9.99", "1"],
            "ERR rate is too low for max: max/rate must be <= 1e10 seconds".into(),
        ),
        ("tb_consume", vec!["k"], vec!["10", "1", "0x1"], nan("cost")),
        ("tb_consume", vec!["k"], vec!["10", "1", "1e"], nan("cost")),
        (
            "tb_consume",
            vec!["k"],
            vec!["10", "1", "-0.5"],
            "ERR cost must be >= 0".into(),
        ),
        (
            "tb_consume",
            vec!["k"],
            vec!["10", "1", "10.000001"],
            "ERR cost must not exceed max, it could never pass".into(),
        ),
        (
            "tb_peek",
            vec!["k"],
            vec!["0.99", "1"],
            "ERR cost must not exceed max, it could never pass".into(),
        ),
        ("tb_adjust", vec!["k"], vec!["10", "1", "nan"], nan("delta")),
        ("tb_adjust", vec!["k"], vec!["10", "1", "+"], nan("delta")),
        (
            "tb_mconsume",
            vec!["a", "b"],
            vec!["1", "1", "1", "1", "1", "2"],
            "ERR cost must not exceed max, it could never pass (group 2)".into(),
        ),
        (
            "tb_mconsume",
            vec!["a", "b", "a"],
            vec!["1", "1", "1", "1", "1", "1", "1", "1", "1"],
            "ERR duplicate key: group 3 repeats the key of group 1".into(),
        ),
    ];
    // Keys that are not buckets (set up by `broken_keys`), with the error
    // tb-core's rule gives each.
    for (function, key, args) in [
        ("tb_consume", "str", &["10", "1"][..]),
        ("tb_peek", "list", &["10", "1"]),
        ("tb_adjust", "set", &["10", "1", "1"]),
        ("tb_consume", "zset", &["10", "1"]),
        ("tb_consume", "three", &["10", "1"]),
        ("tb_consume", "one", &["10", "1"]),
        ("tb_consume", "nots", &["10", "1"]),
        ("tb_peek", "nantok", &["10", "1"]),
        ("tb_consume", "spacetok", &["10", "1"]),
        ("tb_adjust", "hexts", &["10", "1", "1"]),
        ("tb_consume", "plusts", &["10", "1"]),
        ("tb_consume", "longts", &["10", "1"]),
    ] {
        calls.push((function, vec![key], args.to_vec(), key_error(key, None)));
    }
    calls.push((
        "tb_mconsume",
        vec!["fine", "hexts"],
        vec!["10", "1", "1", "10", "1", "1"],
        key_error("hexts", Some(2)),
    ));
    calls.push((
        "tb_mconsume",
        vec!["fine", "list", "three"],
        vec!["10", "1", "1", "10", "1", "1", "10", "1", "1"],
        key_error("list", Some(2)),
    ));
    // The arguments are checked before the key.
    calls.push(("tb_consume", vec!["str"], vec!["10", "x"], nan("rate")));
    // A positive cost too small to change a balance near max: admitting
    // it would charge nothing, forever.
    let too_small =
        "ERR cost is too small to charge a bucket of this max: use 0 or at least max/2^53";
    calls.push((
        "tb_consume",
        vec!["new"],
        vec!["1e12", "1000", "0.00001"],
        too_small.to_string(),
    ));
    calls.push((
        "tb_peek",
        vec!["new"],
        vec!["10", "1", "1e-16"],
        too_small.to_string(),
    ));
    calls.push((
        "tb_mconsume",
        vec!["new", "str"],
        vec!["10", "1", "1", "1e12", "1000", "0.00001"],
        format!("{too_small} (group 2)"),
    ));
    calls.extend(bad_lease_calls());
    calls
}

/// The lease functions' bad calls: arity (keys included), each argument in
/// the module's order of checks, and keys that hold no leases.
fn bad_lease_calls() -> Vec<(&'static str, Vec<&'static str>, Vec<&'static str>, String)> {
    let arity = |f: &str| format!("ERR wrong number of arguments for '{f}' command");
    let not_int = |a: &str| format!("ERR {a} must be an integer");
    let limit = "ERR limit must be >= 1 and <= 1000000".to_string();
    let lease_ms = "ERR lease_ms must be >= 1 and <= 86400000".to_string();
    let bad_id = "ERR id must be 1 to 256 bytes".to_string();
    let long_id: &'static str = "i".repeat(257).leak();
    let not_lease =
        "ERR key is not a lease key: each field must hold <expires_at_us>:<weight>".to_string();
    let wrongtype = "WRONGTYPE Operation against a key holding the wrong kind of value".to_string();
    vec![
        ("tb_acquire", vec![], vec!["2", "1000", "id"], arity("tb_acquire")),
        ("tb_acquire", vec!["l"], vec!["2", "1000"], arity("tb_acquire")),
        ("tb_acquire", vec!["l"], vec!["2", "1000", "id", "1", "1"], arity("tb_acquire")),
        // A bucket key needs three numbers: 3 + 3 or 4 + 3 arguments.
        ("tb_acquire", vec!["l", "b"], vec!["2", "1000", "id", "1", "1"], arity("tb_acquire")),
        ("tb_acquire", vec!["l", "b"], vec!["2", "1000", "id", "1", "1", "1", "1", "1"], arity("tb_acquire")),
        ("tb_release", vec!["l"], vec![], arity("tb_release")),
        ("tb_release", vec!["l", "m"], vec!["id"], arity("tb_release")),
        ("tb_renew", vec!["l"], vec!["id"], arity("tb_renew")),
        ("tb_renew", vec!["l"], vec!["id", "1", "1"], arity("tb_renew")),
        ("tb_inflight", vec![], vec![], arity("tb_inflight")),
        ("tb_inflight", vec!["l"], vec!["x"], arity("tb_inflight")),
        ("tb_acquire", vec!["l"], vec!["x", "y", ""], not_int("limit")),
        ("tb_acquire", vec!["l"], vec!["2.0", "1000", "id"], not_int("limit")),
        ("tb_acquire", vec!["l"], vec!["0", "1000", "id"], limit.clone()),
        ("tb_acquire", vec!["l"], vec!["1000001", "1000", "id"], limit),
        ("tb_acquire", vec!["l"], vec!["2", "1e3", "id"], not_int("lease_ms")),
        ("tb_acquire", vec!["l"], vec!["2", "0", "id"], lease_ms.clone()),
        ("tb_acquire", vec!["l"], vec!["2", "86400001", "id"], lease_ms.clone()),
        ("tb_acquire", vec!["l"], vec!["2", "1000", ""], bad_id.clone()),
        ("tb_acquire", vec!["l"], vec!["2", "1000", long_id], bad_id.clone()),
        // A word there names the module's clauses too; a decimal is a bad weight.
        (
            "tb_acquire",
            vec!["l"],
            vec!["2", "1000", "id", "one"],
            "ERR syntax error at argument 5: expected weight, BUCKET or QUOTA".into(),
        ),
        ("tb_acquire", vec!["l"], vec!["2", "1000", "id", "1.5"], not_int("weight")),
        ("tb_acquire", vec!["l"], vec!["2", "1000", "id", "-1"], "ERR weight must be >= 1".into()),
        (
            "tb_acquire",
            vec!["l"],
            vec!["2", "1000", "id", "3"],
            "ERR weight must not exceed limit, it could never fit".into(),
        ),
        (
            "tb_acquire",
            vec!["l", "b"],
            vec!["2", "1000", "id", "10", "1", "11"],
            "ERR cost must not exceed max, it could never pass (group 1)".into(),
        ),
        (
            "tb_acquire",
            vec!["l", "b", "c"],
            vec!["2", "1000", "id", "1", "10", "1", "1", "0x1", "1", "1"],
            "ERR max must be a finite decimal number (group 2)".into(),
        ),
        (
            "tb_acquire",
            vec!["l", "b", "l"],
            vec!["2", "1000", "id", "10", "1", "1", "10", "1", "1"],
            "ERR the key of group 2 is the lease key".into(),
        ),
        (
            "tb_acquire",
            vec!["l", "b", "b"],
            vec!["2", "1000", "id", "10", "1", "1", "10", "1", "1"],
            "ERR duplicate key: group 2 repeats the key of group 1".into(),
        ),
        ("tb_release", vec!["l"], vec![""], bad_id.clone()),
        ("tb_renew", vec!["l"], vec![long_id, "x"], bad_id),
        ("tb_renew", vec!["l"], vec!["id", "-5"], lease_ms),
        // Keys: another type, a hash of other values, a lease key used as
        // a bucket; the arguments are checked first.
        ("tb_inflight", vec!["str"], vec![], wrongtype.clone()),
        ("tb_release", vec!["list"], vec!["id"], wrongtype.clone()),
        ("tb_acquire", vec!["three"], vec!["2", "1000", "id"], not_lease.clone()),
        ("tb_renew", vec!["one"], vec!["tokens", "1000"], not_lease.clone()),
        ("tb_inflight", vec!["halfway"], vec![], not_lease.clone()),
        ("tb_acquire", vec!["three", "str"], vec!["2", "1000", "id", "10", "1", "1"], not_lease),
        ("tb_acquire", vec!["held", "str"], vec!["2", "1000", "id", "10", "1", "1"], wrongtype),
        ("tb_acquire", vec!["str"], vec!["2", "x", "id"], not_int("lease_ms")),
        (
            "tb_acquire",
            vec!["new", "held"],
            vec!["2", "1000", "id", "10", "1", "1"],
            "ERR key is not a token bucket: the hash must hold exactly the fields tokens and ts (group 1)".into(),
        ),
        (
            "tb_consume",
            vec!["held"],
            vec!["10", "1"],
            "ERR key is not a token bucket: the hash must hold exactly the fields tokens and ts".into(),
        ),
    ]
}

/// Hashes the error cases use, none of them a valid bucket.
const BROKEN_HASHES: [(&str, &[(&str, &str)]); 8] = [
    ("three", &[("tokens", "1"), ("ts", "1"), ("x", "1")]),
    ("one", &[("tokens", "1")]),
    ("nots", &[("tokens", "1"), ("t", "1")]),
    ("nantok", &[("tokens", "nan"), ("ts", "1")]),
    ("spacetok", &[("tokens", " 1"), ("ts", "1")]),
    ("hexts", &[("tokens", "1"), ("ts", "0x10")]),
    ("plusts", &[("tokens", "1"), ("ts", "+10")]),
    ("longts", &[("tokens", "1"), ("ts", "12345678901234567")]),
];

/// Keys the error cases use, none of them a valid bucket.
fn broken_keys(c: &mut redis::Connection) {
    let mut p = redis::pipe();
    p.cmd("SET").arg("str").arg("1");
    p.cmd("RPUSH").arg("list").arg("1");
    p.cmd("SADD").arg("set").arg("1");
    p.cmd("ZADD").arg("zset").arg(1).arg("1");
    for (k, fields) in BROKEN_HASHES {
        p.cmd("HSET").arg(k).arg(fields);
    }
    // A lease key (its leases expired long ago), and a hash of leases but
    // for one field.
    p.cmd("HSET").arg(&["held", "a", "1:1", "b", "2:3"]);
    p.cmd("HSET").arg(&["halfway", "a", "1:1", "b", "2"]);
    let _: () = p.query(c).unwrap();
}

/// The error a call gets for one of `broken_keys`, by tb-core's rule
/// (`group`: TB.MCONSUME's group number).
fn key_error(key: &str, group: Option<usize>) -> String {
    let hash = BROKEN_HASHES
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, fields)| {
            fields
                .iter()
                .map(|&(f, v)| (f.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        });
    let view = hash.as_ref().map_or(KeyView::Other, KeyView::Hash);
    let e = view.load().expect_err("a broken key");
    group.map_or(e, |g| e.in_group(g)).to_string()
}

#[test]
fn denials_zero_costs_peeks_and_errors_write_nothing() {
    let s = Server::with(Config::without_module());
    let mut c = library_conn(&s);
    let _replica = start_replica(&s, Config::without_module());
    broken_keys(&mut c);
    // A drained bucket that refills 1 token per 1000 s.
    fcall(&mut c, "tb_consume", &["k"], &["2", "0.001", "2"]);
    // A lease key whose one slot is taken for 1000 s, beside an expired
    // lease that only a write would prune.
    assert_eq!(
        fcall(&mut c, "tb_acquire", &["busy"], &["1", "1000000", "holder"]),
        [1, 1, 0, 1_000_000]
    );
    hset(&mut c, "busy", &["old", "1:1"]);
    let keys_before = snapshot_without_expiry(&mut c);
    let k_state = hgetall(&mut c, "k");
    let k_expiry = int(&mut c, "PEXPIRETIME", "k");
    wait_replicas(&mut c, 1);
    let offset = repl_offset(&mut c);
    let changes = dirty(&mut c);

    for _ in 0..10 {
        assert_eq!(
            fcall(&mut c, "tb_consume", &["k"], &["2", "0.001", "1"])[0],
            0
        );
        assert_eq!(
            fcall(&mut c, "tb_consume", &["k"], &["2", "0.001", "0"])[0],
            1
        );
        assert_eq!(fcall(&mut c, "tb_peek", &["k"], &["2", "0.001", "1"])[0], 0);
        // One bucket short: the other, though admitted, is not charged.
        let m: Value = fcall_cmd(
            "tb_mconsume",
            &[b"fresh", b"k"],
            &["5", "1", "1", "2", "0.001", "1"],
        )
        .query(&mut c)
        .unwrap();
        let Value::Array(m) = m else { panic!("{m:?}") };
        assert_eq!(m[0], Value::Int(0));
        assert_eq!(
            m[2],
            Value::Array(vec![
                Value::Int(1),
                Value::Int(5),
                Value::Int(0),
                Value::Int(0)
            ])
        );
        let r: Vec<i64> = evalsha_cmd("tb_consume", &[b"k"], &["2", "0.001", "1"])
            .query(&mut c)
            .unwrap();
        assert_eq!(r[0], 0);
        // No slot, by FCALL and EVALSHA; a slot but a bucket short; an
        // unknown or expired id released or renewed; INFLIGHT.
        for cmd in [fcall_cmd, evalsha_cmd] {
            let no_slot: Vec<i64> = cmd("tb_acquire", &[b"busy"], &["1", "1000", "me"])
                .query(&mut c)
                .unwrap();
            assert_eq!(no_slot[..2], [0, 1]);
            assert!(no_slot[2] > 990_000 && no_slot[3] == 0, "{no_slot:?}");
            let short: Value = cmd(
                "tb_acquire",
                &[b"free", b"k"],
                &["1", "1000", "me", "2", "0.001", "1"],
            )
            .query(&mut c)
            .unwrap();
            let Value::Array(short) = short else {
                panic!("{short:?}")
            };
            assert_eq!(short[..2], [Value::Int(0), Value::Int(0)], "{short:?}");
            for (f, args, reply) in [
                ("tb_release", &["nobody"][..], [0, 1]),
                ("tb_release", &["old"], [0, 1]),
                ("tb_renew", &["old", "1000"], [0, 0]),
                ("tb_renew", &["nobody", "1000"], [0, 0]),
            ] {
                let r: Vec<i64> = cmd(f, &[b"busy"], args).query(&mut c).unwrap();
                assert_eq!(r, reply, "{f} {args:?}");
            }
            let r: i64 = cmd("tb_inflight", &[b"busy"], &[]).query(&mut c).unwrap();
            assert_eq!(r, 1);
        }
    }
    // Cost 0 and peeks on a missing key do not create it.
    assert_eq!(
        fcall(&mut c, "tb_consume", &["new"], &["2", "1", "0"]),
        [1, 2, 0, 0]
    );
    assert_eq!(
        fcall(&mut c, "tb_peek", &["new"], &["2", "1", "2"]),
        [1, 2, 0, 0]
    );
    // Nor does any error, from the library or from its EVAL scripts.
    for (function, keys, args, expected) in bad_calls() {
        let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
        let cmd = fcall_cmd(function, &keys, &args);
        assert_eq!(
            run(&mut c, &cmd),
            Err(expected.clone()),
            "{function} {keys:?} {args:?}"
        );
        let cmd = evalsha_cmd(function, &keys, &args);
        assert_eq!(
            run(&mut c, &cmd),
            Err(expected),
            "EVALSHA {function} {keys:?} {args:?}"
        );
    }

    assert_eq!(repl_offset(&mut c), offset, "nothing was replicated");
    assert_eq!(dirty(&mut c), changes, "nothing was changed");
    assert_eq!(snapshot_without_expiry(&mut c), keys_before);
    assert_eq!(hgetall(&mut c, "k"), k_state);
    assert_eq!(int(&mut c, "PEXPIRETIME", "k"), k_expiry);
}

/// A bucket whose `ts` is a minute ahead of the server clock (a clock step
/// back, a failover to a node whose clock is behind) refills nothing until
/// then, and every form's times say so: the module, FCALL and EVALSHA.
#[test]
fn every_form_waits_for_a_future_ts() {
    let s = Server::start();
    let mut c = library_conn(&s);
    let module: CmdOf = |f, k, a| {
        let mut cmd = redis::cmd(&f.replace("tb_", "TB.").to_uppercase());
        cmd.arg(k).arg(a);
        cmd
    };
    for (form, cmd) in std::iter::once(("module", module)).chain(FORMS) {
        for function in ["tb_consume", "tb_peek", "tb_mconsume"] {
            let t0 = server_time_us(&mut c);
            let ts = (t0 + 60_000_000).to_string();
            hset(&mut c, "k", &["tokens", "0", "ts", &ts]);
            let reply = run(&mut c, &cmd(function, &[b"k"], &["10", "1", "1"]))
                .unwrap_or_else(|e| panic!("{form} {function}: {e}"));
            let elapsed_ms = (server_time_us(&mut c) - t0 + 999) / 1000;
            let ints: Vec<i64> = match &reply {
                Value::Array(v) if function == "tb_mconsume" => {
                    let overall: i64 = redis::from_redis_value(&v[1]).unwrap();
                    let bucket: Vec<i64> = redis::from_redis_value(&v[2]).unwrap();
                    assert_eq!(overall, bucket[2], "{form}: overall retry");
                    bucket
                }
                v => redis::from_redis_value(v).unwrap(),
            };
            let ctx = format!("{form} {function}: {ints:?}");
            assert_eq!(ints[..2], [0, 0], "{ctx}");
            // A minute until ts, then a second of refill for cost 1.
            assert!(ints[2] <= 61_000 && ints[2] >= 61_000 - elapsed_ms, "{ctx}");
            assert_eq!(ints[3] - ints[2], 9_000, "{ctx}: full 9 s after the retry");
            assert_eq!(hgetall(&mut c, "k")["ts"], ts, "{ctx}: written");
        }
    }
}

/// As the module does, group by group: a bad group stops the call before
/// a later group's key is read, so an expired later key is not deleted.
#[test]
fn mconsume_stops_at_a_bad_group_before_reading_later_keys() {
    let s = lazy_expiry_only(Config::without_module());
    let mut c = s.conn();
    for bad in ["string", "hash"] {
        for (form, cmd) in FORMS {
            bad_then_expired(&mut c, bad);
            load_library(&mut c);
            load_scripts(&mut c);
            let before = expired_keys(&mut c);
            let call = cmd(
                "tb_mconsume",
                &[b"bad", b"later"],
                &["10", "1", "1", "10", "1", "1"],
            );
            let err = run(&mut c, &call).expect_err("a bad group is an error");
            assert!(
                err.starts_with(if bad == "string" {
                    "WRONGTYPE"
                } else {
                    "ERR key is not a token bucket"
                }),
                "{form}: {err}"
            );
            assert_eq!(expired_keys(&mut c), before, "{form} {bad}: later was read");
            assert_eq!(dbsize(&mut c), 2, "{form} {bad}");
        }
    }
}

/// The EVAL scripts carry no shebang flags, so Redis checks memory only
/// when a script writes: under OOM they still answer denials, cost-0 calls
/// and peeks, and fail (writing nothing) only when they would write. The
/// library's tb_consume is refused up front; FCALL_RO tb_peek answers.
#[test]
fn under_oom_eval_scripts_fail_only_when_they_write() {
    let s = Server::with(Config::without_module());
    let mut c = library_conn(&s);
    fcall(&mut c, "tb_consume", &["drained"], &["1", "0.001", "1"]);
    out_of_memory(&mut c, 2 << 20);
    let before = snapshot_without_expiry(&mut c);
    let eval =
        |c: &mut redis::Connection, f: &str, k: &[u8], a: &[&str]| run(c, &evalsha_cmd(f, &[k], a));
    let denied = eval(&mut c, "tb_consume", b"drained", &["1", "0.001", "1"]).unwrap();
    assert!(
        matches!(&denied, Value::Array(r) if r[0] == Value::Int(0)),
        "{denied:?}"
    );
    assert!(eval(&mut c, "tb_consume", b"new", &["1", "0.001", "0"]).is_ok());
    assert!(eval(&mut c, "tb_peek", b"new", &["1", "0.001", "1"]).is_ok());
    let err = eval(&mut c, "tb_consume", b"new", &["1", "0.001", "1"]).unwrap_err();
    assert!(err.starts_with("OOM"), "{err}");
    for (f, args) in [
        ("tb_consume", &["1", "0.001", "1"][..]),
        ("tb_mconsume", &["1", "0.001", "1"]),
        ("tb_adjust", &["1", "0.001", "1"]),
    ] {
        let err = run(&mut c, &fcall_cmd(f, &[b"drained"], args)).unwrap_err();
        assert!(err.starts_with("OOM"), "{f}: {err}");
    }
    assert!(run(
        &mut c,
        &fcall_cmd("tb_peek", &[b"drained"], &["1", "0.001", "1"])
    )
    .is_ok());
    assert_eq!(
        snapshot_without_expiry(&mut c),
        before,
        "nothing was written"
    );
}

/// Every key with its type and contents, whatever the type.
fn snapshot_without_expiry(c: &mut redis::Connection) -> Vec<(Vec<u8>, String, Value)> {
    let mut keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(c).unwrap();
    keys.sort();
    keys.into_iter()
        .map(|k| {
            let kind: String = redis::cmd("TYPE").arg(&k).query(c).unwrap();
            let dump: Value = redis::cmd("DUMP").arg(&k).query(c).unwrap();
            (k, kind, dump)
        })
        .collect()
}

/// `function` of `lease` (if any) and `n` buckets `{form}:0`.. (slow
/// refill: they must not expire before KEYS below), after `head`: 10,000
/// buckets pass, their replies after `reply_head`, and 10,001 are refused.
/// Then the keys of `form` there are.
fn up_to_ten_thousand_buckets(
    c: &mut redis::Connection,
    (form, cmd): (&str, CmdOf),
    (function, lease, head): (&str, Option<&str>, &[&str]),
    reply_head: &[i64],
) -> usize {
    for (n, ok) in [(10_000usize, true), (10_001, false)] {
        let keys: Vec<Vec<u8>> = lease
            .map(|l| format!("{form}:{l}"))
            .into_iter()
            .chain((0..n).map(|i| format!("{form}:{i}")))
            .map(String::into_bytes)
            .collect();
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let mut args = head.to_vec();
        args.extend(["3", "0.01", "1"].repeat(n));
        let r = run(c, &cmd(function, &keys, &args));
        if ok {
            let Ok(Value::Array(r)) = r else {
                panic!("{r:?}")
            };
            let head: Vec<Value> = reply_head.iter().copied().map(Value::Int).collect();
            assert_eq!(r.len(), head.len() + n);
            assert_eq!(r[..head.len()], head[..]);
        } else {
            let too_many = "ERR too many buckets: at most 10000 groups per call";
            assert_eq!(r, Err(too_many.into()));
        }
    }
    let written: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{form}:*"))
        .query(c)
        .unwrap();
    written.len()
}

#[test]
fn mconsume_takes_up_to_ten_thousand_groups() {
    let s = Server::with(Config::without_module());
    let mut c = library_conn(&s);
    for form in FORMS {
        let call = ("tb_mconsume", None, &[][..]);
        let written = up_to_ten_thousand_buckets(&mut c, form, call, &[1, 0]);
        assert_eq!(written, 10_000, "{}", form.0);
    }
}

#[test]
fn mconsume_is_all_or_nothing_and_reports_the_worst_retry() {
    let s = Server::with(Config::without_module());
    let mut c = library_conn(&s);
    // b: drained, 1 token per 1000 s; c: drained, 1 token per 2000 s.
    fcall(&mut c, "tb_consume", &["b"], &["1", "0.001", "1"]);
    fcall(&mut c, "tb_consume", &["c"], &["1", "0.0005", "1"]);
    let b = hgetall(&mut c, "b");
    let m: Value = fcall_cmd(
        "tb_mconsume",
        &[b"a", b"b", b"c"],
        &["10", "1", "1", "1", "0.001", "1", "1", "0.0005", "1"],
    )
    .query(&mut c)
    .unwrap();
    let Value::Array(m) = m else { panic!("{m:?}") };
    let ints = |v: &Value| -> Vec<i64> { redis::from_redis_value(v).unwrap() };
    assert_eq!(m[0], Value::Int(0));
    let (rb, rc) = (ints(&m[3]), ints(&m[4]));
    assert_eq!(ints(&m[2]), [1, 10, 0, 0], "a passes alone");
    assert_eq!((rb[0], rc[0]), (0, 0));
    assert!(
        rb[2] <= 1_000_000 && rc[2] <= 2_000_000 && rc[2] > rb[2],
        "{m:?}"
    );
    assert_eq!(m[1], Value::Int(rc[2]), "the worst retry wins");
    assert_eq!(int(&mut c, "EXISTS", "a"), 0, "a was not charged");
    assert_eq!(hgetall(&mut c, "b"), b);
}

#[test]
fn adjust_refund_is_capped_at_max_and_debt_floors_at_minus_max() {
    let s = Server::with(Config::without_module());
    let mut c = library_conn(&s);
    // From full (no key), a late charge of 100 stops at -max; a cost-1
    // request then needs 11 tokens of refill, a full bucket 20.
    assert_eq!(
        fcall(&mut c, "tb_adjust", &["k"], &["10", "1", "-100"]),
        [1, -10, 11_000, 20_000]
    );
    let h = hgetall(&mut c, "k");
    assert_eq!(h["tokens"], "-10");
    let ts: i64 = h["ts"].parse().unwrap();
    assert_eq!(int(&mut c, "PEXPIRETIME", "k"), (ts + 999) / 1000 + 20_000);
    // While in debt, consumers are denied.
    assert_eq!(
        fcall(&mut c, "tb_consume", &["k"], &["10", "1", "1"])[..2],
        [0, -10]
    );
    // A refund beyond max fills the bucket, and a full bucket is no key.
    assert_eq!(
        fcall(&mut c, "tb_adjust", &["k"], &["10", "1", "1000"]),
        [1, 10, 0, 0]
    );
    assert_eq!(int(&mut c, "EXISTS", "k"), 0);
}

#[test]
fn binary_keys_are_kept_byte_for_byte() {
    let s = Server::with(Config::without_module());
    let mut c = library_conn(&s);
    let keys: [&[u8]; 3] = [b"rl:\x00nul", b"rl:\xff\xfe not utf8", b""];
    for key in keys {
        let r: Vec<i64> = fcall_cmd("tb_consume", &[key], &["5", "1"])
            .query(&mut c)
            .unwrap();
        assert_eq!(r, [1, 4, 0, 1000]);
        assert_eq!(hgetall(&mut c, key)["tokens"], "4");
        let r: Vec<i64> = fcall_cmd("tb_peek", &[key], &["5", "1"])
            .query(&mut c)
            .unwrap();
        assert_eq!(r[..2], [1, 4]);
    }
    let r: Value = fcall_cmd("tb_mconsume", &keys, &["5", "1", "1"].repeat(3))
        .query(&mut c)
        .unwrap();
    let Value::Array(r) = r else { panic!("{r:?}") };
    assert_eq!(r[0], Value::Int(1));
    let all: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    assert_eq!(all.len(), 3);
}

// ---- the EVAL scripts ------------------------------------------------------

/// EVALSHA works once the script is cached; after SCRIPT FLUSH it fails
/// with NOSCRIPT, EVAL runs (and caches) the script, and EVALSHA works
/// again. redis::Script does exactly this fallback.
fn noscript_fallback(c: &mut redis::Connection) {
    let sha = load_eval_script(c);
    let words = ["consume", "10", "0.001"];
    let evalsha = |c: &mut redis::Connection| {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&sha).arg(1).arg("k").arg(&words);
        run(c, &cmd)
    };
    let ints = |v: Result<Value, String>| -> Vec<i64> {
        redis::from_redis_value(&v.expect("a reply")).unwrap()
    };
    assert_eq!(ints(evalsha(c)), [1, 9, 0, 1_000_000]);
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(c).unwrap();
    let err = evalsha(c).unwrap_err();
    assert!(err.starts_with("NOSCRIPT"), "{err}");
    let r: Vec<i64> = eval_cmd("EVAL", "k", &words).query(c).unwrap();
    assert_eq!(r[..3], [1, 8, 0]);
    assert_eq!(ints(evalsha(c))[..3], [1, 7, 0]);
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(c).unwrap();
    let r: Vec<i64> = redis::Script::new(eval_script())
        .key("k")
        .arg(&words)
        .invoke(c)
        .unwrap();
    assert_eq!(r[..3], [1, 6, 0]);
    assert_eq!(int(c, "HLEN", "k"), 2);
}

#[test]
fn eval_scripts_fall_back_from_noscript_on_redis_7() {
    let s = Server::with(Config::without_module());
    let mut c = s.conn();
    noscript_fallback(&mut c);
    // Peek writes nothing, so it also runs as a read-only script; consume
    // is refused there.
    let peek: Vec<i64> = eval_cmd("EVAL_RO", "fresh", &["peek", "10", "1"])
        .query(&mut c)
        .unwrap();
    assert_eq!(peek, [1, 10, 0, 0]);
    let ro = eval_cmd("EVAL_RO", "fresh", &["consume", "10", "1"]);
    assert!(error_of(&mut c, &ro).contains("read-only"));
    assert_eq!(int(&mut c, "EXISTS", "fresh"), 0);
    // Likewise inflight and acquire.
    hset(&mut c, "held", &["a", "9007199254740991:3"]);
    let n: i64 = eval_cmd("EVAL_RO", "held", &["inflight"])
        .query(&mut c)
        .unwrap();
    assert_eq!(n, 3);
    let ro = eval_cmd("EVAL_RO", "fresh", &["acquire", "1", "1000", "id"]);
    assert!(error_of(&mut c, &ro).contains("read-only"));
    assert_eq!(int(&mut c, "EXISTS", "fresh"), 0);
}

fn redis62() -> Config {
    Config {
        bin: pypi_server(Pypi::Redis62),
        ..Config::without_module()
    }
}

#[test]
fn eval_scripts_fall_back_from_noscript_on_redis_6_2() {
    let s = Server::with(redis62());
    let mut c = s.conn();
    assert!(info_field(&mut c, "server", "redis_version").starts_with("6.2"));
    noscript_fallback(&mut c);
}

#[test]
fn eval_scripts_replicate_effects_on_redis_6_2() {
    // With verbatim script replication, a script that read TIME may not
    // write; the scripts switch to effects replication themselves.
    let config = redis62().arg("lua-replicate-commands", "no");
    let s = Server::with(config.clone());
    let replica = start_replica(&s, config);
    let mut c = s.conn();
    let mut plain = redis::cmd("EVAL");
    plain
        .arg("redis.call('TIME') redis.call('SET', KEYS[1], 1)")
        .arg(1)
        .arg("x");
    assert!(error_of(&mut c, &plain).contains("replicate_commands"));
    load_scripts(&mut c);

    let evalsha = |c: &mut redis::Connection, f: &str, keys: &[&[u8]], args: &[&str]| {
        let cmd = evalsha_cmd(f, keys, args);
        run(c, &cmd).map(|v| redis::from_redis_value::<Vec<i64>>(&v).unwrap())
    };
    assert_eq!(
        evalsha(&mut c, "tb_consume", &[b"k"], &["10", "0.001", "3"]),
        Ok(vec![1, 7, 0, 3_000_000])
    );
    assert_eq!(
        evalsha(&mut c, "tb_adjust", &[b"j"], &["10", "1", "-4"]),
        Ok(vec![1, 6, 0, 4_000])
    );
    wait_replicas(&mut c, 1);
    let mut r = replica.conn();
    for (key, reset) in [("k", 3_000_000), ("j", 4_000)] {
        let h = hgetall(&mut c, key);
        assert_eq!(h.len(), 2);
        assert_eq!(hgetall(&mut r, key), h, "{key} on the replica");
        let ttl = int(&mut r, "PTTL", key);
        assert!(ttl > 0 && ttl <= reset + 1, "{key}: pttl {ttl}");
    }
    assert_eq!(hgetall(&mut r, "k")["tokens"], "7");
    // Leases too: an acquire, a renew and a release.
    assert_eq!(
        evalsha(&mut c, "tb_acquire", &[b"l"], &["2", "60000", "a", "2"]),
        Ok(vec![1, 2, 0, 60_000])
    );
    assert_eq!(
        evalsha(&mut c, "tb_renew", &[b"l"], &["a", "90000"]),
        Ok(vec![1, 90_000])
    );
    wait_replicas(&mut c, 1);
    assert_eq!(hgetall(&mut r, "l"), hgetall(&mut c, "l"));
    let ttl = int(&mut r, "PTTL", "l");
    assert!(ttl > 60_000 && ttl <= 90_000, "pttl {ttl}");
    assert_eq!(
        evalsha(&mut c, "tb_release", &[b"l"], &["a"]),
        Ok(vec![1, 0])
    );
    wait_replicas(&mut c, 1);
    assert_eq!(int(&mut r, "EXISTS", "l"), 0);

    // Denials, zero costs and peeks replicate nothing.
    let offset = repl_offset(&mut c);
    for _ in 0..5 {
        let deny = evalsha(&mut c, "tb_consume", &[b"k"], &["10", "0.001", "8"]);
        assert_eq!(deny.unwrap()[0], 0);
        let free = evalsha(&mut c, "tb_consume", &[b"k"], &["10", "0.001", "0"]);
        assert_eq!(free.unwrap()[0], 1);
        let peek = evalsha(&mut c, "tb_peek", &[b"k"], &["10", "0.001", "8"]);
        assert_eq!(peek.unwrap()[0], 0);
        let gone = evalsha(&mut c, "tb_renew", &[b"l"], &["a", "1000"]);
        assert_eq!(gone, Ok(vec![0, 0]));
    }
    assert_eq!(repl_offset(&mut c), offset);
}

// ---- leases ------------------------------------------------------------------

/// A lease key's fields and expire time, on the primary and on a replica.
fn same_on_replica(c: &mut redis::Connection, r: &mut redis::Connection, key: &str, ctx: &str) {
    wait_replicas(c, 1);
    let (h, at) = (hgetall(&mut *c, key), int(c, "PEXPIRETIME", key));
    assert_eq!(
        (hgetall(&mut *r, key), int(r, "PEXPIRETIME", key)),
        (h, at),
        "{ctx}"
    );
}

/// The key's expiry as the module sets it: the latest lease's end, in
/// whole ms rounded up.
fn expiry_of_latest(c: &mut redis::Connection, key: &str) -> i64 {
    let latest = hgetall(c, key)
        .values()
        .map(|v| v.split(':').next().unwrap().parse::<i64>().unwrap())
        .max()
        .unwrap();
    (latest + 999) / 1000
}

/// Leases written through FCALL and EVALSHA reach a replica without the
/// module as their effects: the same fields and expire time after each
/// acquire, renew (pruning an expired lease) and release (the last one
/// deleting the key), with a BUCKET clause charging its bucket.
#[test]
fn lease_writes_replicate_as_effects() {
    let s = Server::with(Config::without_module());
    let mut c = library_conn(&s);
    let replica = start_replica(&s, Config::without_module());
    let mut r = replica.conn();
    let t0 = server_time_us(&mut c);
    for (name, cmd) in FORMS {
        let call = |c: &mut redis::Connection, f: &str, keys: &[&[u8]], args: &[&str]| {
            run(c, &cmd(f, keys, args)).unwrap_or_else(|e| panic!("{name} {f}: {e}"))
        };
        let ints = |v: Value| -> Vec<i64> { redis::from_redis_value(&v).unwrap() };
        assert_eq!(
            ints(call(&mut c, "tb_acquire", &[b"l"], &["3", "100000", "a"])),
            [1, 1, 0, 100_000]
        );
        let a = hgetall(&mut c, "l")["a"].clone();
        let (expires, weight) = a.split_once(':').unwrap();
        assert_eq!(weight, "1");
        assert!(expires.parse::<i64>().unwrap() >= t0 + 100_000_000, "{a}");
        assert_eq!(
            int(&mut c, "PEXPIRETIME", "l"),
            expiry_of_latest(&mut c, "l")
        );
        same_on_replica(&mut c, &mut r, "l", name);

        let Value::Array(with_bucket) = call(
            &mut c,
            "tb_acquire",
            &[b"l", b"b"],
            &["3", "50000", "b", "2", "10", "0.001", "4"],
        ) else {
            panic!()
        };
        assert_eq!(with_bucket[..4], [1, 3, 0, 50_000].map(Value::Int));
        assert_eq!(hgetall(&mut c, "b")["tokens"], "6");
        same_on_replica(&mut c, &mut r, "l", name);
        same_on_replica(&mut c, &mut r, "b", name);

        // Written by hand, long expired: the next write prunes it.
        hset(&mut c, "l", &["old", "1:1"]);
        assert_eq!(
            ints(call(&mut c, "tb_renew", &[b"l"], &["b", "300000"])),
            [1, 300_000]
        );
        let h = hgetall(&mut c, "l");
        assert_eq!(h.keys().collect::<Vec<_>>(), ["a", "b"], "{name}: pruned");
        assert_eq!(
            int(&mut c, "PEXPIRETIME", "l"),
            expiry_of_latest(&mut c, "l")
        );
        same_on_replica(&mut c, &mut r, "l", name);

        assert_eq!(ints(call(&mut c, "tb_release", &[b"l"], &["b"])), [1, 1]);
        assert_eq!(hgetall(&mut c, "l").len(), 1);
        // The key now ends with a, not with b's later lease.
        assert_eq!(
            int(&mut c, "PEXPIRETIME", "l"),
            expiry_of_latest(&mut c, "l")
        );
        same_on_replica(&mut c, &mut r, "l", name);
        assert_eq!(ints(call(&mut c, "tb_release", &[b"l"], &["a"])), [1, 0]);
        assert_eq!(int(&mut c, "EXISTS", "l"), 0);
        wait_replicas(&mut c, 1);
        assert_eq!(int(&mut r, "EXISTS", "l"), 0, "{name}");
        let _: () = redis::cmd("DEL").arg("b").query(&mut c).unwrap();
    }
    // INFLIGHT runs on the replica.
    fcall(&mut c, "tb_acquire", &["l"], &["3", "100000", "a", "2"]);
    wait_replicas(&mut c, 1);
    let n = run(&mut r, &fcall_cmd("tb_inflight", &[b"l"], &[]));
    assert_eq!(n, Ok(Value::Int(2)));
    assert!(error_of(&mut r, &fcall_cmd("tb_release", &[b"l"], &["a"])).starts_with("READONLY"));
}

/// Lease writes through FCALL and EVALSHA reach the AOF as their effects,
/// as the module's do (leases.rs `replicas_and_the_aof_hold_the_primarys_leases`):
/// after acquires (with a BUCKET clause), renewals, releases and expired
/// leases pruned, a server restarted from the AOF alone holds the same
/// lease hashes, buckets and expire times, and not the keys a last release
/// deleted.
#[test]
fn lease_writes_reach_the_aof() {
    let config = Config::without_module().arg("appendonly", "yes");
    let mut s = Server::with(config.clone());
    let mut c = library_conn(&s);
    for (name, cmd) in FORMS {
        let mut call = |f: &str, keys: &[&str], args: &[&str]| {
            let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
            run(&mut c, &cmd(f, &keys, args)).unwrap_or_else(|e| panic!("{name} {f}: {e}"))
        };
        let keys = ["l", "lb", "b", "gone"].map(|k| format!("{k}:{name}"));
        let [leases, with_bucket, bucket, gone] = keys.each_ref().map(String::as_str);
        for i in 0..30 {
            let id = format!("id-{}", i % 11);
            let lease_ms = if i % 5 == 0 { "30" } else { "600000" };
            call("tb_acquire", &[leases], &["8", lease_ms, id.as_str()]);
            if i % 3 == 0 {
                let renewed = format!("id-{}", i % 7);
                call("tb_renew", &[leases], &[renewed.as_str(), "900000"]);
            }
            if i % 4 == 0 {
                let released = format!("id-{}", i % 9);
                call("tb_release", &[leases], &[released.as_str()]);
            }
            if i % 10 == 9 {
                // Let the short leases expire: the next write prunes them.
                std::thread::sleep(std::time::Duration::from_millis(40));
            }
            call(
                "tb_acquire",
                &[with_bucket, bucket],
                &["3", "600000", id.as_str(), "50", "0.01", "1"],
            );
        }
        call("tb_acquire", &[gone], &["1", "600000", "a"]);
        call("tb_release", &[gone], &["a"]);
    }
    let state = snapshot(&mut c);
    let names: Vec<String> = state
        .keys()
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "b:EVALSHA",
            "b:FCALL",
            "l:EVALSHA",
            "l:FCALL",
            "lb:EVALSHA",
            "lb:FCALL"
        ]
    );
    for (key, (_, at)) in &state {
        assert!(*at > 0, "{key:?} has no expire time");
    }
    s.kill9();
    s.restart_with(config);
    assert_eq!(snapshot(&mut s.conn()), state, "restored from the AOF");
}

/// Under OOM the library acts as the module's commands: tb_acquire is
/// refused up front (denials too, as TB.ACQUIRE's deny-oom), tb_release
/// and tb_renew run and write, tb_inflight answers. The EVAL script has no
/// flags: it answers denials, refuses an admitted acquire before writing
/// anything (even with an expired lease to prune), and releases and renews.
#[test]
fn under_oom_leases_are_released_and_renewed_but_not_taken() {
    let s = Server::with(Config::without_module());
    let mut c = library_conn(&s);
    for key in ["busy", "held"] {
        let limit = if key == "busy" { "1" } else { "5" };
        fcall(&mut c, "tb_acquire", &[key], &[limit, "1000000", "h"]);
        hset(&mut c, key, &["old", "1:1"]);
    }
    out_of_memory(&mut c, 2 << 20);
    let before = snapshot_without_expiry(&mut c);
    let acquire = |c: &mut redis::Connection, cmd: CmdOf, key: &[u8], limit: &str| {
        run(c, &cmd("tb_acquire", &[key], &[limit, "1000", "x"]))
    };
    let oom = |r: Result<Value, String>| r.unwrap_err().starts_with("OOM");
    for (key, limit) in [(b"busy", "1"), (b"held", "5")] {
        assert!(oom(acquire(&mut c, fcall_cmd, key, limit)));
    }
    assert!(oom(acquire(&mut c, fcall_cmd, b"new", "1")));
    let denied = acquire(&mut c, evalsha_cmd, b"busy", "1");
    assert!(
        matches!(&denied, Ok(Value::Array(r)) if r[..2] == [Value::Int(0), Value::Int(1)]),
        "{denied:?}"
    );
    assert!(oom(acquire(&mut c, evalsha_cmd, b"held", "5")));
    assert_eq!(
        run(&mut c, &fcall_cmd("tb_inflight", &[b"held"], &[])),
        Ok(Value::Int(1))
    );
    assert_eq!(
        snapshot_without_expiry(&mut c),
        before,
        "nothing was written"
    );

    // Renew by both forms, each pruning the expired lease, then release.
    for (key, (_, cmd)) in ["held", "busy"].into_iter().zip(FORMS) {
        let call = |c: &mut redis::Connection, f: &str, args: &[&str]| -> Vec<i64> {
            let reply = cmd(f, &[key.as_bytes()], args).query(c);
            reply.unwrap_or_else(|e| panic!("{key}: {e}"))
        };
        let at = int(&mut c, "PEXPIRETIME", key);
        assert_eq!(
            call(&mut c, "tb_renew", &["h", "2000000"]),
            [1, 2_000_000],
            "{key}"
        );
        assert!(int(&mut c, "PEXPIRETIME", key) > at + 900_000, "{key}");
        assert_eq!(hgetall(&mut c, key).len(), 1, "{key}: pruned");
        assert_eq!(call(&mut c, "tb_release", &["h"]), [1, 0], "{key}");
        assert_eq!(int(&mut c, "EXISTS", key), 0, "{key}");
    }
}

#[test]
fn acquire_takes_up_to_ten_thousand_bucket_clauses() {
    let s = Server::with(Config::without_module());
    let mut c = library_conn(&s);
    for form in FORMS {
        let call = ("tb_acquire", Some("lease"), &["2", "100000", "id"][..]);
        let written = up_to_ten_thousand_buckets(&mut c, form, call, &[1, 1, 0, 100_000]);
        assert_eq!(written, 10_001, "{}", form.0);
    }
}

/// A key with more expired leases than Lua can unpack at once is pruned
/// all the same, by an acquire and by a release, through FCALL and EVALSHA.
#[test]
fn twenty_thousand_expired_leases_are_pruned() {
    let s = Server::with(Config::without_module());
    let mut c = library_conn(&s);
    let n = 20_000;
    let expired: Vec<(String, &str)> = (0..n).map(|i| (format!("x{i}"), "1:1")).collect();
    let expire = |c: &mut redis::Connection| {
        let _: () = redis::cmd("HSET").arg("l").arg(&expired).query(c).unwrap();
    };
    for (form, cmd) in FORMS {
        let call = |c: &mut redis::Connection, f: &str, args: &[&str]| -> Vec<i64> {
            let reply = cmd(f, &[b"l"], args).query(c);
            reply.unwrap_or_else(|e| panic!("{form}: {e}"))
        };
        expire(&mut c);
        let r = call(&mut c, "tb_acquire", &["2", "100000", "a"]);
        assert_eq!(r, [1, 1, 0, 100_000], "{form}");
        assert_eq!(int(&mut c, "HLEN", "l"), 1, "{form}");
        expire(&mut c);
        fcall(&mut c, "tb_acquire", &["l"], &["2", "200000", "b"]);
        assert_eq!(call(&mut c, "tb_release", &["b"]), [1, 1], "{form}");
        assert_eq!(
            hgetall(&mut c, "l").keys().collect::<Vec<_>>(),
            ["a"],
            "{form}"
        );
        let _: () = redis::cmd("DEL").arg("l").query(&mut c).unwrap();
    }
}
