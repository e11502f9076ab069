//! The EVAL script, embedded by src/engine.rs: written into OUT_DIR by
//! lua/gen_eval.py, the one generator (`make` and testkit run it too), so
//! a plain `cargo build -p tb-rls` on a fresh clone has it. Its inlining
//! is too much to write twice; Python 3 (standard library only) is what
//! the repository's other builds need already.

use std::path::PathBuf;
use std::process::{exit, Command};

fn var(name: &str) -> Option<PathBuf> {
    std::env::var_os(name).map(PathBuf::from)
}

fn main() {
    // Read when run, not when compiled: one compiled build script can
    // serve two checkouts that share a target directory.
    let (Some(manifest), Some(out)) = (var("CARGO_MANIFEST_DIR"), var("OUT_DIR")) else {
        eprintln!("tb-rls build.rs: CARGO_MANIFEST_DIR or OUT_DIR is not set (run through cargo)");
        exit(1);
    };
    let lua = manifest.join("../lua");
    let (library, generator) = (lua.join("tb.lua"), lua.join("gen_eval.py"));
    println!("cargo:rerun-if-changed={}", library.display());
    println!("cargo:rerun-if-changed={}", generator.display());
    let script = out.join("tb-eval.lua");
    match Command::new("python3")
        .arg(&generator)
        .arg(&script)
        .status()
    {
        Ok(s) if s.success() => {}
        Ok(s) => {
            eprintln!(
                "tb-rls build.rs: python3 {} {} failed ({s})",
                generator.display(),
                script.display()
            );
            exit(1);
        }
        Err(e) => {
            eprintln!(
                "tb-rls build.rs: can't run python3 for {} ({e}): tb-rls embeds the EVAL script it writes; install Python 3",
                generator.display()
            );
            exit(1);
        }
    }
}
