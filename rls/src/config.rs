//! envoyproxy/ratelimit's YAML configuration, read unchanged, plus our
//! optional `rate_limit.burst` (the bucket's max) and `rate_limit.calendar`
//! with `utc_offset_minutes` (a calendar quota instead of a bucket). Every
//! refusal names the file, the line and the reason; nothing of a refused
//! file is kept.

use crate::error::Error;
use crate::unit::Unit;
use saphyr::{MarkedYaml, ScalarStyle, YamlData, YamlLoader};
use std::collections::HashMap;
use std::path::Path;

/// The module's largest bucket (contract: max_capacity).
pub const MAX_BURST: u64 = 1_000_000_000_000;
/// The module's slowest fill: max / rate in seconds (contract: max_fill_seconds).
pub const MAX_FILL_SECONDS: f64 = 1e10;

/// A `rate_limit` block.
#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    pub requests_per_unit: u32,
    /// None only when `unlimited`.
    pub unit: Option<Unit>,
    pub unlimited: bool,
    pub name: String,
    pub replaces: Vec<String>,
    pub shadow_mode: bool,
    pub detailed_metric: bool,
    /// The bucket's max; None: `requests_per_unit`.
    pub burst: Option<u64>,
    /// `calendar: true`: a quota of `requests_per_unit` per UTC day, ISO
    /// week, calendar month or year (unit DAY to YEAR only), not a bucket.
    pub calendar: bool,
    /// The calendar's distance from UTC (the module's OFFSET); 0 unless
    /// `calendar`.
    pub utc_offset_minutes: i32,
    /// The descriptor's path in the config, `domain.key_value.key` (the
    /// peer's stats key).
    pub full_key: String,
}

/// One entry of a descriptor list, with its nested list.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Node {
    /// By the peer's composite key: `key` or `key_value`.
    pub children: HashMap<String, Node>,
    /// The children whose composite key holds a `*`, in file order, split
    /// on it (the peer tries them in that order).
    pub wildcards: Vec<(String, Vec<String>)>,
    pub limit: Option<Limit>,
    /// `share_threshold`: every value this wildcard entry matches shares
    /// one bucket.
    pub share_threshold: bool,
}

/// Every domain of every file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Config {
    pub domains: HashMap<String, Node>,
}

/// Keys the peer accepts (its validKeys), and ours: `burst`, `calendar`,
/// `utc_offset_minutes`.
const VALID_KEYS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    "burst",
    "calendar",
    "utc_offset_minutes",
];

/// The module's OFFSET bound, in minutes either side of UTC.
pub const MAX_UTC_OFFSET_MINUTES: i64 = 1439;

impl Config {
    /// The `.yaml`/`.yml` files of `dir`, in name order (the peer's
    /// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config layout); none is an error.
    pub fn load_dir(dir: &Path) -> Result<Config, Error> {
        Config::from_texts(&read_dir_texts(dir)?)
    }

    /// `path`: a file, or a directory of files.
    pub fn load(path: &Path) -> Result<Config, Error> {
        Config::from_texts(&Config::read_texts(path)?)
    }

    /// Each file's name and text, as `load` reads them: what a reload
    /// compares with the last texts it saw.
    pub fn read_texts(path: &Path) -> Result<Vec<(String, String)>, Error> {
        if path.is_dir() {
            return read_dir_texts(path);
        }
        Ok(vec![read_text(path)?])
    }

    /// The config of these files (name, text), in this order.
    pub fn from_texts(files: &[(String, String)]) -> Result<Config, Error> {
        let mut config = Config::default();
        for (path, text) in files {
            config.add_str(path, text)?;
        }
        Ok(config)
    }

    /// Adds one file's text, named `path` in errors. A domain already
    /// loaded is refused, as the peer does by default.
    pub fn add_str(&mut self, path: &str, text: &str) -> Result<(), Error> {
        let (domain, node) = parse_file(path, text)?;
        if self.domains.contains_key(&domain.0) {
            return Err(Error::config(
                path,
                domain.1,
                format!("duplicate domain '{}' in config file", domain.0),
            ));
        }
        self.domains.insert(domain.0, node);
        Ok(())
    }
}

fn read_text(path: &Path) -> Result<(String, String), Error> {
    let shown = path.display().to_string();
    let text =
        std::fs::read_to_string(path).map_err(|e| Error::config(&shown, 0, e.to_string()))?;
    Ok((shown, text))
}

fn read_dir_texts(dir: &Path) -> Result<Vec<(String, String)>, Error> {
    let shown = dir.display().to_string();
    let entries = std::fs::read_dir(dir).map_err(|e| Error::config(&shown, 0, e.to_string()))?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|e| Error::config(&shown, 0, e.to_string()))?
            .path();
        let yaml = matches!(
            path.extension().and_then(|x| x.to_str()),
            Some("yaml" | "yml")
        );
        if yaml && path.is_file() {
            files.push(path);
        }
    }
    if files.is_empty() {
        return Err(Error::config(
            &shown,
            0,
            "no .yaml or .yml file in this directory",
        ));
    }
    files.sort();
    files.iter().map(|p| read_text(p)).collect()
}

/// A scalar's text and whether it was written plain (not quoted).
fn scalar<'a>(node: &'a MarkedYaml<'_>) -> Option<(&'a str, bool)> {
    match &node.data {
        YamlData::Representation(text, style, _) => {
            Some((text.as_ref(), *style == ScalarStyle::Plain))
        }
        _ => None,
    }
}

fn line(node: &MarkedYaml<'_>) -> usize {
    node.span.start.line()
}

fn is_null(node: &MarkedYaml<'_>) -> bool {
    matches!(
        scalar(node),
        Some(("" | "~" | "null" | "Null" | "NULL", true))
    )
}

struct Reader<'p> {
    path: &'p str,
}

impl Reader<'_> {
    fn err(&self, node: &MarkedYaml<'_>, reason: impl Into<String>) -> Error {
        Error::config(self.path, line(node), reason)
    }

    /// A mapping's (key, value) pairs, every key checked against VALID_KEYS.
    fn mapping<'n, 'i>(
        &self,
        node: &'n MarkedYaml<'i>,
        what: &str,
    ) -> Result<Vec<(&'n str, &'n MarkedYaml<'i>)>, Error> {
        let YamlData::Mapping(map) = &node.data else {
            return Err(self.err(node, format!("{what} must be a mapping")));
        };
        let mut pairs = Vec::with_capacity(map.len());
        for (k, v) in map {
            let Some((key, _)) = scalar(k) else {
                return Err(self.err(k, "config error, key is not of type string"));
            };
            if !VALID_KEYS.contains(&key) {
                return Err(self.err(k, format!("config error, unknown key '{key}'")));
            }
            pairs.push((key, v));
        }
        Ok(pairs)
    }

    /// A string field: any scalar's text (the peer reads `value: 123` as
    /// "123"); null is empty.
    fn string(&self, node: &MarkedYaml<'_>, key: &str) -> Result<String, Error> {
        if is_null(node) {
            return Ok(String::new());
        }
        match scalar(node) {
            Some((text, _)) => Ok(text.to_string()),
            None => Err(self.err(node, format!("{key} must be a string"))),
        }
    }

    /// A boolean, in YAML 1.1's spellings as the peer's parser reads them.
    fn boolean(&self, node: &MarkedYaml<'_>, key: &str) -> Result<bool, Error> {
        if is_null(node) {
            return Ok(false);
        }
        const TRUE: &[&str] = &[
            "true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON", "y", "Y",
        ];
        const FALSE: &[&str] = &[
            "false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF", "n", "N",
        ];
        match scalar(node) {
            Some((t, true)) if TRUE.contains(&t) => Ok(true),
            Some((t, true)) if FALSE.contains(&t) => Ok(false),
            _ => Err(self.err(node, format!("{key} must be true or false"))),
        }
    }

    /// A plain decimal integer in `lo..=hi`.
    fn integer(&self, node: &MarkedYaml<'_>, key: &str, lo: u64, hi: u64) -> Result<u64, Error> {
        let bad = || self.err(node, format!("{key} must be an integer from {lo} to {hi}"));
        match scalar(node) {
            Some((t, true)) => {
                let digits = t.strip_prefix('+').unwrap_or(t);
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                match digits.parse::<u64>() {
                    Ok(n) if (lo..=hi).contains(&n) => Ok(n),
                    _ => Err(bad()),
                }
            }
            _ => Err(bad()),
        }
    }

    /// A plain decimal integer, maybe negative, in `lo..=hi`.
    fn signed(&self, node: &MarkedYaml<'_>, key: &str, lo: i64, hi: i64) -> Result<i64, Error> {
        let bad = || self.err(node, format!("{key} must be an integer from {lo} to {hi}"));
        let Some((t, true)) = scalar(node) else {
            return Err(bad());
        };
        let (negative, digits) = match t.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, t.strip_prefix('+').unwrap_or(t)),
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let n = digits.parse::<i64>().map_err(|_| bad())?;
        let n = if negative { -n } else { n };
        if (lo..=hi).contains(&n) {
            Ok(n)
        } else {
            Err(bad())
        }
    }

    /// A sequence of mappings (null: empty).
    fn list<'n, 'i>(
        &self,
        node: &'n MarkedYaml<'i>,
        key: &str,
    ) -> Result<Vec<&'n MarkedYaml<'i>>, Error> {
        if is_null(node) {
            return Ok(Vec::new());
        }
        let YamlData::Sequence(items) = &node.data else {
            return Err(self.err(node, format!("{key} must be a list")));
        };
        for item in items {
            if !matches!(item.data, YamlData::Mapping(_)) {
                return Err(self.err(
                    item,
                    format!(
                        "config error, yaml file contains list of type other than map in {key}"
                    ),
                ));
            }
        }
        Ok(items.iter().collect())
    }

    fn descriptors(
        &self,
        parent: &mut Node,
        parent_key: &str,
        items: &[&MarkedYaml<'_>],
    ) -> Result<(), Error> {
        for item in items {
            let mut key = String::new();
            let mut value = String::new();
            let mut rate_limit = None;
            let mut nested = Vec::new();
            let mut shadow_mode = false;
            let mut detailed_metric = false;
            let mut share_threshold = false;
            for (k, v) in self.mapping(item, "a descriptor")? {
                match k {
                    "key" => key = self.string(v, k)?,
                    "value" => value = self.string(v, k)?,
                    "rate_limit" => rate_limit = (!is_null(v)).then_some(v),
                    "descriptors" => nested = self.list(v, k)?,
                    "shadow_mode" => shadow_mode = self.boolean(v, k)?,
                    "detailed_metric" => detailed_metric = self.boolean(v, k)?,
                    "share_threshold" => share_threshold = self.boolean(v, k)?,
                    // Metrics only: accepted, no effect here.
                    "value_to_metric" => {
                        self.boolean(v, k)?;
                    }
                    // Response metadata is not sent: accepted, ignored.
                    "metadata" => {}
                    "quota_mode" => {
                        if self.boolean(v, k)? {
                            return Err(self.err(v, "quota_mode is not supported by tb-rls"));
                        }
                    }
                    _ => {
                        return Err(self.err(
                            v,
                            format!("config error, '{k}' does not belong in a descriptor"),
                        ))
                    }
                }
            }
            if key.is_empty() {
                return Err(self.err(item, "descriptor has empty key"));
            }
            let final_key = if value.is_empty() {
                key.clone()
            } else {
                format!("{key}_{value}")
            };
            let full_key = format!("{parent_key}{final_key}");
            if parent.children.contains_key(&final_key) {
                return Err(self.err(
                    item,
                    format!("duplicate descriptor composite key '{full_key}'"),
                ));
            }
            let limit = match rate_limit {
                Some(block) => Some(self.limit(block, &full_key, shadow_mode, detailed_metric)?),
                None => None,
            };
            if share_threshold && !final_key.contains('*') {
                return Err(self.err(
                    item,
                    format!(
                        "share_threshold can only be used with wildcard values (containing '*'), but found key '{final_key}'"
                    ),
                ));
            }
            if final_key.contains('*') {
                let parts = final_key.split('*').map(str::to_string).collect();
                parent.wildcards.push((final_key.clone(), parts));
            }
            let mut node = Node {
                limit,
                share_threshold,
                ..Node::default()
            };
            self.descriptors(&mut node, &format!("{full_key}."), &nested)?;
            parent.children.insert(final_key, node);
        }
        Ok(())
    }

    fn limit(
        &self,
        block: &MarkedYaml<'_>,
        full_key: &str,
        shadow_mode: bool,
        detailed_metric: bool,
    ) -> Result<Limit, Error> {
        let mut requests_per_unit = 0u64;
        let mut unit_text: Option<(String, &MarkedYaml<'_>)> = None;
        let mut unlimited = false;
        let mut name = String::new();
        let mut replaces = Vec::new();
        let mut burst = None;
        let mut calendar: Option<(bool, &MarkedYaml<'_>)> = None;
        let mut offset: Option<(i64, &MarkedYaml<'_>)> = None;
        for (k, v) in self.mapping(block, "rate_limit")? {
            match k {
                "requests_per_unit" => {
                    requests_per_unit = self.integer(v, k, 0, u64::from(u32::MAX))?
                }
                "unit" => unit_text = Some((self.string(v, k)?, v)),
                "unlimited" => unlimited = self.boolean(v, k)?,
                "name" => name = self.string(v, k)?,
                "burst" => burst = Some((self.integer(v, k, 1, MAX_BURST)?, v)),
                "calendar" => calendar = Some((self.boolean(v, k)?, v)),
                "utc_offset_minutes" => {
                    offset = Some((
                        self.signed(v, k, -MAX_UTC_OFFSET_MINUTES, MAX_UTC_OFFSET_MINUTES)?,
                        v,
                    ))
                }
                "replaces" => {
                    for r in self.list(v, k)? {
                        let mut replaced = String::new();
                        for (rk, rv) in self.mapping(r, "a replaces entry")? {
                            if rk != "name" {
                                return Err(self.err(
                                    rv,
                                    format!("config error, '{rk}' does not belong in replaces"),
                                ));
                            }
                            replaced = self.string(rv, rk)?;
                        }
                        replaces.push((replaced, r));
                    }
                }
                _ => {
                    return Err(self.err(
                        v,
                        format!("config error, '{k}' does not belong in rate_limit"),
                    ))
                }
            }
        }
        let unit = match &unit_text {
            Some((text, _)) => Unit::parse(text),
            None => None,
        };
        if unlimited {
            if unit.is_some() {
                return Err(self.err(block, "should not specify rate limit unit when unlimited"));
            }
        } else if unit.is_none() {
            let (text, at) = match &unit_text {
                Some((t, n)) => (t.as_str(), *n),
                None => ("", block),
            };
            return Err(self.err(at, format!("invalid rate limit unit '{text}'")));
        }
        for (replaced, at) in &replaces {
            if replaced.is_empty() {
                return Err(self.err(at, "should not have an empty replaces entry"));
            }
            if *replaced == name {
                return Err(self.err(at, "replaces should not contain name of same descriptor"));
            }
        }
        let is_calendar = matches!(calendar, Some((true, _)));
        if let Some((true, at)) = calendar {
            if unlimited {
                return Err(self.err(at, "calendar does not apply to an unlimited limit"));
            }
            if unit.and_then(Unit::calendar_period).is_none() {
                let text = unit_text.as_ref().map_or("", |(t, _)| t.as_str());
                return Err(self.err(
                    at,
                    format!("calendar needs unit day, week, month or year, not '{text}'"),
                ));
            }
            if let Some((_, b)) = burst {
                return Err(self.err(
                    b,
                    "burst does not apply to a calendar limit: its budget is requests_per_unit",
                ));
            }
        }
        if let Some((_, at)) = offset {
            if !is_calendar {
                return Err(self.err(at, "utc_offset_minutes needs calendar: true"));
            }
        }
        // The module's bounds, so that no configured limit fails in Redis.
        if let (Some((b, at)), Some(u)) = (burst, unit) {
            if requests_per_unit == 0 {
                return Err(self.err(at, "burst needs requests_per_unit above 0"));
            }
            let rate = requests_per_unit as f64 / u.seconds() as f64;
            if b as f64 / rate > MAX_FILL_SECONDS {
                return Err(self.err(
                    at,
                    format!("burst {b} refills too slowly at {requests_per_unit} per {u:?}: burst / rate must be at most 1e10 seconds"),
                ));
            }
        }
        Ok(Limit {
            requests_per_unit: requests_per_unit as u32,
            unit,
            unlimited,
            name,
            replaces: replaces.into_iter().map(|(r, _)| r).collect(),
            shadow_mode,
            detailed_metric,
            burst: burst.map(|(b, _)| b),
            calendar: is_calendar,
            // Read within ±1439, so it fits.
            utc_offset_minutes: offset.map_or(0, |(m, _)| m as i32),
            full_key: full_key.to_string(),
        })
    }
}

/// One file: its domain (and the line it is on) and its descriptor tree.
fn parse_file(path: &str, text: &str) -> Result<((String, usize), Node), Error> {
    let mut parser = saphyr_parser::Parser::new_from_str(text);
    let mut loader: YamlLoader<MarkedYaml> = YamlLoader::default();
    loader.early_parse(false);
    let scan = |e: &saphyr::ScanError| {
        Error::config(
            path,
            e.marker().line(),
            format!("error loading config file: {}", e.info()),
        )
    };
    parser.load(&mut loader, false).map_err(|e| scan(&e))?;
    if let Some(e) = loader.error() {
        return Err(scan(e));
    }
    let docs = loader.into_documents();
    let Some(root) = docs.first() else {
        return Err(Error::config(
            path,
            0,
            "config file cannot have empty domain",
        ));
    };
    let reader = Reader { path };
    let mut domain = String::new();
    let mut domain_line = line(root);
    let mut descriptors = Vec::new();
    for (k, v) in reader.mapping(root, "the file")? {
        match k {
            "domain" => {
                domain = reader.string(v, k)?;
                domain_line = line(v);
            }
            "descriptors" => descriptors = reader.list(v, k)?,
            _ => {
                return Err(reader.err(
                    v,
                    format!("config error, '{k}' does not belong at the top of a file"),
                ))
            }
        }
    }
    if domain.is_empty() {
        return Err(reader.err(root, "config file cannot have empty domain"));
    }
    let mut node = Node::default();
    reader.descriptors(&mut node, &format!("{domain}."), &descriptors)?;
    Ok(((domain, domain_line), node))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Config, Error> {
        let mut c = Config::default();
        c.add_str("f.yaml", text)?;
        Ok(c)
    }

    fn err(text: &str) -> String {
        match load(text) {
            Ok(_) => panic!("accepted: {text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn reads_the_peers_example_with_nesting() {
        let c = load(
            "domain: messaging\ndescriptors:\n  - key: message_type\n    value: marketing\n    descriptors:\n      - key: to_number\n        rate_limit:\n          unit: day\n          requests_per_unit: 5\n  - key: to_number\n    rate_limit:\n      unit: day\n      requests_per_unit: 100\n",
        )
        .unwrap();
        let d = &c.domains["messaging"];
        let nested = &d.children["message_type_marketing"].children["to_number"];
        let l = nested.limit.as_ref().unwrap();
        assert_eq!((l.requests_per_unit, l.unit), (5, Some(Unit::Day)));
        assert_eq!(l.full_key, "messaging.message_type_marketing.to_number");
        assert_eq!(
            d.children["to_number"]
                .limit
                .as_ref()
                .unwrap()
                .requests_per_unit,
            100
        );
        assert!(d.children["message_type_marketing"].limit.is_none());
    }

    #[test]
    fn reads_every_field_and_burst() {
        let c = load(
            "domain: d\ndescriptors:\n  - key: k\n    value: \"v*\"\n    shadow_mode: true\n    detailed_metric: yes\n    value_to_metric: false\n    share_threshold: true\n    metadata:\n      a: {b: 1}\n    rate_limit:\n      name: n1\n      unit: MINUTE\n      requests_per_unit: 60\n      burst: 10\n      replaces:\n        - name: other\n",
        )
        .unwrap();
        let node = &c.domains["d"].children["k_v*"];
        assert!(node.share_threshold);
        assert_eq!(
            c.domains["d"].wildcards,
            vec![("k_v*".to_string(), vec!["k_v".to_string(), String::new()])]
        );
        let l = node.limit.as_ref().unwrap();
        assert_eq!(l.name, "n1");
        assert_eq!(l.replaces, vec!["other".to_string()]);
        assert!(l.shadow_mode && l.detailed_metric && !l.unlimited);
        assert_eq!(l.burst, Some(10));
    }

    #[test]
    fn a_numeric_value_is_its_text() {
        let c = load("domain: d\ndescriptors:\n  - key: code\n    value: 1.10\n    rate_limit: {unit: second, requests_per_unit: 1}\n").unwrap();
        assert!(c.domains["d"].children.contains_key("code_1.10"));
    }

    #[test]
    fn unlimited_takes_no_unit() {
        let c = load(
            "domain: d\ndescriptors:\n  - key: ldap\n    rate_limit:\n      unlimited: true\n",
        )
        .unwrap();
        let l = c.domains["d"].children["ldap"].limit.as_ref().unwrap();
        assert!(l.unlimited && l.unit.is_none());
        assert_eq!(
            err("domain: d\ndescriptors:\n  - key: ldap\n    rate_limit:\n      unlimited: true\n      unit: second\n"),
            "f.yaml:5: should not specify rate limit unit when unlimited"
        );
    }

    #[test]
    fn refusals_name_the_line_and_reason() {
        assert_eq!(
            err("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n"),
            "f.yaml:5: invalid rate limit unit 'fortnight'"
        );
        assert_eq!(
            err("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 1\n"),
            "f.yaml:5: invalid rate limit unit ''"
        );
        assert_eq!(
            err("domain: d\ndescriptors:\n  - key: k\n    colour: red\n"),
            "f.yaml:4: config error, unknown key 'colour'"
        );
        assert_eq!(
            err("descriptors: []\n"),
            "f.yaml:1: config file cannot have empty domain"
        );
        assert_eq!(err(""), "f.yaml: config file cannot have empty domain");
        assert_eq!(
            err("domain: d\ndescriptors:\n  - value: v\n"),
            "f.yaml:3: descriptor has empty key"
        );
        assert_eq!(
            err("domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n"),
            "f.yaml:5: duplicate descriptor composite key 'd.k_v'"
        );
        assert_eq!(
            err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n"),
            "f.yaml:4: requests_per_unit must be an integer from 0 to 4294967295"
        );
        assert_eq!(
            err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n"),
            "f.yaml:4: requests_per_unit must be an integer from 0 to 4294967295"
        );
        assert_eq!(
            err("domain: d\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n"),
            "f.yaml:4: shadow_mode must be true or false"
        );
        assert_eq!(
            err("domain: d\ndescriptors:\n  - 5\n"),
            "f.yaml:3: config error, yaml file contains list of type other than map in descriptors"
        );
        assert_eq!(
            err("domain: d\ndescriptors:\n  - key: k\n    share_threshold: true\n"),
            "f.yaml:3: share_threshold can only be used with wildcard values (containing '*'), but found key 'k'"
        );
        assert_eq!(
            err("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: a\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: a\n"),
            "f.yaml:9: replaces should not contain name of same descriptor"
        );
        assert_eq!(
            err("domain: d\ndescriptors:\n  - key: k\n    quota_mode: true\n"),
            "f.yaml:4: quota_mode is not supported by tb-rls"
        );
    }

    #[test]
    fn burst_stays_within_the_modules_bounds() {
        assert_eq!(
            err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 0}\n"),
            "f.yaml:4: burst must be an integer from 1 to 1000000000000"
        );
        assert_eq!(
            err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 1, burst: 1000}\n"),
            "f.yaml:4: burst 1000 refills too slowly at 1 per Year: burst / rate must be at most 1e10 seconds"
        );
        assert_eq!(
            err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 0, burst: 5}\n"),
            "f.yaml:4: burst needs requests_per_unit above 0"
        );
    }

    #[test]
    fn calendar_takes_day_to_year_and_an_offset() {
        let c = load("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: Month\n      requests_per_unit: 1000\n      calendar: true\n      utc_offset_minutes: -300\n  - key: plain\n    rate_limit: {unit: month, requests_per_unit: 5, calendar: false}\n").unwrap();
        let l = c.domains["d"].children["k"].limit.as_ref().unwrap();
        assert_eq!(
            (l.calendar, l.utc_offset_minutes, l.unit),
            (true, -300, Some(Unit::Month))
        );
        let plain = c.domains["d"].children["plain"].limit.as_ref().unwrap();
        assert_eq!((plain.calendar, plain.utc_offset_minutes), (false, 0));
        for unit in ["day", "WEEK", "year"] {
            let text = format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: {unit}, requests_per_unit: 1, calendar: true, utc_offset_minutes: 1439}}\n");
            assert!(
                load(&text).unwrap().domains["d"].children["k"]
                    .limit
                    .as_ref()
                    .unwrap()
                    .calendar
            );
        }
    }

    #[test]
    fn calendar_refusals_name_the_line_and_reason() {
        assert_eq!(
            err("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      calendar: true\n"),
            "f.yaml:7: calendar needs unit day, week, month or year, not 'second'"
        );
        assert_eq!(
            err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1, calendar: true}\n"),
            "f.yaml:4: calendar needs unit day, week, month or year, not 'hour'"
        );
        assert_eq!(
            err("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      calendar: true\n"),
            "f.yaml:6: calendar does not apply to an unlimited limit"
        );
        assert_eq!(
            err("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n      requests_per_unit: 10\n      calendar: true\n      burst: 5\n"),
            "f.yaml:8: burst does not apply to a calendar limit: its budget is requests_per_unit"
        );
        assert_eq!(
            err("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n      requests_per_unit: 10\n      utc_offset_minutes: 60\n"),
            "f.yaml:7: utc_offset_minutes needs calendar: true"
        );
        for bad in ["1440", "-1440", "1.5", "'60'", "-+5", "x"] {
            assert_eq!(
                err(&format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n      requests_per_unit: 10\n      calendar: true\n      utc_offset_minutes: {bad}\n")),
                "f.yaml:8: utc_offset_minutes must be an integer from -1439 to 1439",
                "{bad}"
            );
        }
        assert_eq!(
            err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1, calendar: sometimes}\n"),
            "f.yaml:4: calendar must be true or false"
        );
    }

    #[test]
    fn a_syntax_error_names_its_line() {
        let e = err("domain: d\ndescriptors:\n  - key: [unclosed\n");
        assert!(
            e.starts_with("f.yaml:") && e.contains("error loading config file"),
            "{e}"
        );
        let dup = err("domain: d\ndomain: e\n");
        assert!(dup.starts_with("f.yaml:2:"), "{dup}");
    }

    #[test]
    fn a_second_file_with_the_same_domain_is_refused() {
        let mut c = Config::default();
        c.add_str("a.yaml", "domain: d\n").unwrap();
        let e = c.add_str("b.yaml", "\ndomain: d\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "b.yaml:2: duplicate domain 'd' in config file"
        );
    }

    #[test]
    fn a_directory_loads_its_yaml_files_and_an_empty_one_is_refused() {
        let dir = std::env::temp_dir().join(format!("tb-rls-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = Config::load_dir(&dir).unwrap_err().to_string();
        assert!(
            e.ends_with("no .yaml or .yml file in this directory"),
            "{e}"
        );
        std::fs::write(dir.join("a.yaml"), "domain: a\n").unwrap();
        std::fs::write(dir.join("b.yml"), "domain: b\n").unwrap();
        std::fs::write(dir.join("notes.txt"), "not yaml: [").unwrap();
        let c = Config::load(&dir).unwrap();
        let mut names: Vec<_> = c.domains.keys().cloned().collect();
        names.sort();
        assert_eq!(names, ["a", "b"]);
        std::fs::write(
            dir.join("c.yaml"),
            "domain: c\ndescriptors:\n  - key: k\n    rate_limit: {unit: week}\n    bogus: 1\n",
        )
        .unwrap();
        let e = Config::load(&dir).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "{}:5: config error, unknown key 'bogus'",
                dir.join("c.yaml").display()
            )
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
