//! The Lua fallback: the library (FCALL) and the EVAL script (EVALSHA).

use std::process::Command;
use std::sync::OnceLock;

/// The Lua fallback library, as shipped.
pub const LIBRARY: &str = include_str!("../../lua/tb.lua");

/// The EVAL script, built from the library by `lua/gen_eval.py` (it is
/// never committed): `EVALSHA sha numkeys key... <operation> arg...`.
pub fn eval_script() -> &'static str {
    static SCRIPT: OnceLock<String> = OnceLock::new();
    SCRIPT.get_or_init(|| {
        let out = Command::new("python3")
            .arg(crate::root().join("lua/gen_eval.py"))
            .arg("-")
            .output()
            .expect("run python3 lua/gen_eval.py");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("the script is UTF-8")
    })
}

/// `SCRIPT LOAD` of the EVAL script; returns its SHA1.
pub fn load_eval_script(c: &mut redis::Connection) -> String {
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(eval_script())
        .query(c)
        .expect("SCRIPT LOAD");
    assert_eq!(sha, redis::Script::new(eval_script()).get_hash());
    sha
}

/// `FUNCTION LOAD REPLACE` of the Lua library.
pub fn load_library(c: &mut redis::Connection) {
    let name: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(LIBRARY)
        .query(c)
        .expect("FUNCTION LOAD");
    assert_eq!(name, "tb");
}
