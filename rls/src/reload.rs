//! Config reload. The config is read again every interval (a poll: no
//! watcher to lose events across a symlink swap); texts that differ from
//! the ones serving, and read the same on two polls in a row (a file half
//! written, a swap half seen), are parsed and swapped in whole. A call
//! plans on the config it started with. A bad config is logged once and
//! the one serving goes on.

use crate::config::Config;
use crate::error::Error;
use crate::metrics::Metrics;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// The config serving now.
pub struct Live {
    current: RwLock<Arc<Config>>,
}

impl Live {
    pub fn new(config: Config) -> Live {
        Live {
            current: RwLock::new(Arc::new(config)),
        }
    }

    pub fn get(&self) -> Arc<Config> {
        // A panic while holding the lock left a whole Arc: still usable.
        match self.current.read() {
            Ok(c) => Arc::clone(&c),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    fn set(&self, config: Config) {
        let new = Arc::new(config);
        match self.current.write() {
            Ok(mut c) => *c = new,
            Err(poisoned) => *poisoned.into_inner() = new,
        }
    }
}

/// Where the config is read from on each poll.
#[derive(Debug, Clone, PartialEq)]
pub struct Source {
    pub path: PathBuf,
    /// RUNTIME_WATCH_ROOT: `path` lies under this root, a symlink swapped
    /// to publish a new config; each read goes through one target of it.
    pub root: Option<PathBuf>,
}

/// One read: each file's name and text, or why it could not be read.
type Texts = Result<Vec<(String, String)>, Error>;

impl Source {
    /// None when the root was swapped during the read (read it next time).
    fn read(&self) -> Option<Texts> {
        let Some(root) = &self.root else {
            return Some(Config::read_texts(&self.path));
        };
        let shown = root.display().to_string();
        let target = |r: &Path| {
            r.canonicalize()
                .map_err(|e| Error::config(&shown, 0, e.to_string()))
        };
        let before = match target(root) {
            Ok(t) => t,
            Err(e) => return Some(Err(e)),
        };
        let rest = self.path.strip_prefix(root).unwrap_or(Path::new(""));
        let texts = Config::read_texts(&before.join(rest));
        match target(root) {
            Ok(after) if after == before => Some(texts),
            _ => None,
        }
    }
}

/// What one poll did.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// The texts serving.
    Unchanged,
    /// New texts, read once: applied if the next poll reads them again.
    Pending,
    /// Swapped in: its number of domains.
    Reloaded(usize),
    /// Refused; `first` is whether this poll logged it.
    Refused { error: Error, first: bool },
}

pub struct Watcher {
    source: Source,
    live: Arc<Live>,
    serving: Texts,
    pending: Option<Texts>,
    refused: Option<Texts>,
}

impl Watcher {
    /// The first config, read as every poll reads it; a bad one is the error.
    pub fn load(source: Source) -> Result<(Watcher, Arc<Live>), Error> {
        // A swap during the read: read again (a few swaps in a row are unlikely).
        let mut texts = None;
        for _ in 0..10 {
            texts = source.read();
            if texts.is_some() {
                break;
            }
        }
        let shown = source.path.display().to_string();
        let texts =
            texts.ok_or_else(|| Error::config(&shown, 0, "swapped during every read"))??;
        let live = Arc::new(Live::new(Config::from_texts(&texts)?));
        let watcher = Watcher {
            source,
            live: Arc::clone(&live),
            serving: Ok(texts),
            pending: None,
            refused: None,
        };
        Ok((watcher, live))
    }

    pub fn poll(&mut self) -> Outcome {
        let Some(texts) = self.source.read() else {
            return Outcome::Pending;
        };
        if texts == self.serving {
            self.pending = None;
            self.refused = None;
            return Outcome::Unchanged;
        }
        if self.pending.as_ref() != Some(&texts) {
            self.pending = Some(texts);
            return Outcome::Pending;
        }
        let parsed = texts.clone().and_then(|files| Config::from_texts(&files));
        match parsed {
            Ok(config) => {
                let domains = config.domains.len();
                self.live.set(config);
                self.serving = texts;
                self.pending = None;
                self.refused = None;
                Outcome::Reloaded(domains)
            }
            Err(error) => {
                let first = self.refused.as_ref() != Some(&texts);
                self.refused = Some(texts);
                Outcome::Refused { error, first }
            }
        }
    }

    /// Polls every `every` on a thread of its own, for the process's life,
    /// logging and counting each reload and each refused config once.
    pub fn spawn(
        mut self,
        every: std::time::Duration,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<()> {
        std::thread::Builder::new()
            .name("tb-rls-reload".into())
            .spawn(move || loop {
                std::thread::sleep(every);
                match self.poll() {
                    Outcome::Reloaded(n) => {
                        metrics.config_load(true);
                        eprintln!("tb-rls: config reloaded: domains={n}")
                    }
                    Outcome::Refused { error, first: true } => {
                        metrics.config_load(false);
                        eprintln!(
                            "tb-rls: config not reloaded, the previous one serves on: {error}"
                        )
                    }
                    _ => {}
                }
            })
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str =
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1}\n";
    const B: &str =
        "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 2}\n";
    const BAD: &str = "domain: c\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 2}\n";

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tb-rls-reload-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn watcher(path: &Path, root: Option<PathBuf>) -> (Watcher, Arc<Live>) {
        Watcher::load(Source {
            path: path.to_path_buf(),
            root,
        })
        .unwrap()
    }

    #[test]
    fn a_change_read_twice_is_swapped_in_and_a_bad_one_is_logged_once() {
        let d = dir("file");
        let f = d.join("c.yaml");
        std::fs::write(&f, A).unwrap();
        let (mut w, live) = watcher(&f, None);
        assert_eq!(w.poll(), Outcome::Unchanged);
        std::fs::write(&f, B).unwrap();
        assert_eq!(w.poll(), Outcome::Pending);
        assert!(live.get().domains.contains_key("a"), "not yet: read once");
        assert_eq!(w.poll(), Outcome::Reloaded(1));
        assert!(live.get().domains.contains_key("b"));
        std::fs::write(&f, BAD).unwrap();
        assert_eq!(w.poll(), Outcome::Pending);
        let shown = f.display().to_string();
        let refused = |first| Outcome::Refused {
            error: Error::config(&shown, 4, "invalid rate limit unit 'fortnight'"),
            first,
        };
        assert_eq!(w.poll(), refused(true));
        assert_eq!(w.poll(), refused(false));
        assert!(
            live.get().domains.contains_key("b"),
            "the old one serves on"
        );
        std::fs::remove_file(&f).unwrap();
        assert_eq!(w.poll(), Outcome::Pending);
        assert!(matches!(w.poll(), Outcome::Refused { first: true, .. }));
        std::fs::write(&f, B).unwrap();
        assert_eq!(w.poll(), Outcome::Unchanged);
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn under_a_watched_root_a_symlink_swap_is_read_from_the_new_target() {
        let d = dir("root");
        for (v, text) in [("v1", A), ("v2", B)] {
            std::fs::create_dir_all(d.join(v).join("config")).unwrap();
            std::fs::write(d.join(v).join("config/x.yaml"), text).unwrap();
        }
        let root = d.join("current");
        std::os::unix::fs::symlink(d.join("v1"), &root).unwrap();
        let (mut w, live) = watcher(&root.join("config"), Some(root.clone()));
        assert_eq!(w.poll(), Outcome::Unchanged);
        let next = d.join("next");
        std::os::unix::fs::symlink(d.join("v2"), &next).unwrap();
        std::fs::rename(&next, &root).unwrap();
        assert_eq!(w.poll(), Outcome::Pending);
        assert_eq!(w.poll(), Outcome::Reloaded(1));
        assert!(live.get().domains.contains_key("b"));
        std::fs::remove_dir_all(d).unwrap();
    }
}
