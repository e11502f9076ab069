//! Bucket, quota and lease hashes in the keyspace (and the string a redis-cell key
//! holds, which CL.THROTTLE reads and its next write replaces), and the
//! replication of every write as effects (`HSET`, `HDEL`, `PEXPIREAT`,
//! `DEL`).
//!
//! Effects, never the command: a replica or an AOF replay, with or without
//! the module, then ends with the primary's exact hash and expire time
//! instead of recomputing with its own clock.

use crate::ffi::{ArgString, CommandLocal, Ctx, Interned, Kept, Key, Load, OwnedString, RString};
use std::cell::{Cell, OnceCell};
use std::ffi::CStr;
use std::sync::OnceLock;
use tb_core::bucket::{Effect, Limits, Stored};
use tb_core::cell;
use tb_core::contract::{LEASE_SUMMARY_FIELD, START_FIELD, TOKENS_FIELD, TS_FIELD, USED_FIELD};
use tb_core::error::{Error, Step};
use tb_core::lease::{self, LeaseStore, ListField, ListRead, LIST_FIELD};
use tb_core::number::{Text, Upper};
use tb_core::quota::{self, QuotaFields};
use tb_core::state::{self, BucketFields, KeyKind};

/// The points of a write where a test can make the server's call fail
/// (`test-hooks` builds: TB.FAULT).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    HashSet,
    HashDelete,
    Expire,
    Delete,
    /// Any Replicate call.
    Replicate,
}

/// The test hooks' injector, set at load in `test-hooks` builds: the
/// write path asks it without knowing who answers.
#[cfg(feature = "test-hooks")]
static INJECTOR: OnceLock<fn(Fault) -> bool> = OnceLock::new();

/// Lets `injector` make write steps fail (`test-hooks` builds only).
#[cfg(feature = "test-hooks")]
pub fn set_fault_injector(injector: fn(Fault) -> bool) {
    let _ = INJECTOR.set(injector);
}

/// Whether the step at `fault` should fail now, as if the server's call
/// had: never in a release build.
#[inline(always)]
fn injected(fault: Fault) -> bool {
    #[cfg(feature = "test-hooks")]
    if let Some(injector) = INJECTOR.get() {
        return injector(fault);
    }
    let _ = fault;
    false
}

/// The field names `tokens` and `ts`, made once at load.
static FIELDS: OnceLock<[Interned; 2]> = OnceLock::new();

/// A quota's field names `used` and `start`, made once at load.
static QUOTA_FIELDS: OnceLock<[Interned; 2]> = OnceLock::new();

/// A lease key's summary and list field names, made once at load.
static SUMMARY: OnceLock<[Interned; 2]> = OnceLock::new();

/// What the last bucket write wrote that the next one can reuse. Cells,
/// taken and set, never borrowed across a call into Redis (a keyspace
/// notification can run another module's code, which could call us).
struct Recent {
    /// The last whole balance written (its bits) and its `tokens` text,
    /// for `BucketKey::write`. HashSet copies the text and a replication
    /// only holds a reference, so a string kept unchanged can serve any
    /// number of writes; one replaced is released, and Redis frees it once
    /// a pending replication is done with it.
    tokens: Cell<Option<(u64, Kept)>>,
    /// The upper digits of the last `ts` and expire time written.
    ts: Cell<Upper>,
    expire_at: Cell<Upper>,
}

static RECENT: CommandLocal<Recent> = CommandLocal::new(Recent {
    tokens: Cell::new(None),
    ts: Cell::new(Upper::NONE),
    expire_at: Cell::new(Upper::NONE),
});

/// The commands writes replicate as effects, in the order checked.
const EFFECTS: [&CStr; 4] = [c"HSET", c"HDEL", c"PEXPIREAT", c"DEL"];

/// Checks the server can replicate the effects and makes the field names.
///
/// Replicating a write needs HSET, HDEL, PEXPIREAT and DEL by name, so a server
/// whose redis.conf renamed or disabled one (`rename-command PEXPIREAT
/// ""`) would change keys its replicas and AOF never hear of: the module
/// refuses to load there.
pub fn init(load: &Load) -> Result<(), String> {
    if let Some(name) = EFFECTS.iter().find(|name| !load.has_command(name)) {
        return Err(format!(
            "this server has no {} command (renamed or disabled by rename-command?); \
             the module replicates every write as HSET, HDEL, PEXPIREAT and DEL, so it will not load",
            name.to_string_lossy()
        ));
    }
    let intern = |name: &str| load.intern(name).ok_or("could not make a Redis string");
    let fields = [intern(TOKENS_FIELD)?, intern(TS_FIELD)?];
    let list = std::str::from_utf8(LIST_FIELD).map_err(|_| "the list field's name is not text")?;
    let summary = [intern(LEASE_SUMMARY_FIELD)?, intern(list)?];
    let quota = [intern(USED_FIELD)?, intern(START_FIELD)?];
    // A second MODULE LOAD in the same process keeps the first strings.
    let _ = FIELDS.set(fields);
    let _ = QUOTA_FIELDS.set(quota);
    let _ = SUMMARY.set(summary);
    Ok(())
}

/// Gives back the `tokens` string kept between writes, as the module
/// unloads: its static goes with the library.
pub fn unload(ctx: &Ctx) {
    if let Some((_, kept)) = RECENT.get(ctx).tokens.take() {
        ctx.release(kept);
    }
}

/// An open key that should hold a bucket. Closed on drop.
pub struct BucketKey<'c> {
    key: Key<'c>,
    ctx: &'c Ctx,
    /// `load_cell` read a redis-cell string here: the next write replaces it.
    cell_string: bool,
}

/// A bucket key's two fields, as `state::load` reads them.
struct Fields<'k, 'c>(&'k Key<'c>);

impl BucketFields for Fields<'_, '_> {
    fn with_fields<R>(&self, f: impl FnOnce(Option<&[u8]>, Option<&[u8]>) -> R) -> R {
        // `init` set the names before any command was registered.
        let Some([tokens, ts]) = FIELDS.get() else {
            return f(None, None);
        };
        let (tokens, ts) = self.0.hash_get(tokens, ts);
        f(
            tokens.as_ref().map(|s| s.bytes()),
            ts.as_ref().map(|s| s.bytes()),
        )
    }
}

impl<'c> BucketKey<'c> {
    /// Opens `name` for reading (`write` false) or for reading and writing.
    ///
    /// A writer opens the key once, before it knows whether it will write:
    /// the module runs with `REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED`
    /// (set in `lib.rs`), so closing the key signals nothing by itself, and
    /// `apply` signals it only after a real change. A denial therefore
    /// aborts no WATCH and sends no client-side cache invalidation.
    pub fn open(ctx: &'c Ctx, name: ArgString<'c>, write: bool) -> Self {
        BucketKey {
            key: ctx.open_key(name, write),
            ctx,
            cell_string: false,
        }
    }

    /// The stored bucket, `None` for a missing key (a full bucket).
    /// Inlined, so a new key costs its caller one test, not a call.
    #[inline(always)]
    pub fn load(&self) -> Result<Option<Stored>, Error> {
        match self.key.kind() {
            KeyKind::Missing => Ok(None),
            kind => self.load_existing(kind),
        }
    }

    #[inline(never)]
    fn load_existing(&self, kind: KeyKind) -> Result<Option<Stored>, Error> {
        state::load(kind, &Fields(&self.key))
    }

    /// `load` for CL.THROTTLE, which also reads a key redis-cell left: a
    /// string holding its TAT stands for the bucket of these `limits` at
    /// `now_us`, and the next write converts it (`apply`). Any other string
    /// is WRONGTYPE.
    pub fn load_cell(&mut self, limits: &Limits, now_us: i64) -> Result<Option<Stored>, Error> {
        if !self.key.is_string() {
            return self.load();
        }
        let text = self.ctx.string_value(self.key.name());
        let tat = text
            .as_deref()
            .and_then(cell::parse_tat)
            .ok_or(Error::WrongType)?;
        self.cell_string = true;
        Ok(cell::stored_from_tat(tat, limits, now_us))
    }

    /// Carries out a call's effect on this key, and replicates it. `Err`
    /// names the step that failed; nothing else is attempted after it.
    ///
    /// Each local change is checked before it is replicated, so a failed
    /// HashSet or DeleteKey leaves both sides untouched, and a failed
    /// SetAbsExpire replicates the HSET alone. Replicate fails only for an
    /// unknown command, which `init` rules out; its result is checked all
    /// the same.
    pub fn apply(&mut self, effect: &Effect) -> Result<(), Step> {
        match *effect {
            Effect::Nothing => return Ok(()),
            Effect::Save {
                tokens,
                ts_us,
                expire_at_ms,
            } => self.write(tokens, ts_us, expire_at_ms)?,
            Effect::Delete => self.delete()?,
        }
        self.ctx.signal_modified(&self.key.name());
        Ok(())
    }

    fn write(&mut self, tokens: f64, ts_us: i64, expire_at_ms: i64) -> Result<(), Step> {
        // A redis-cell key (only CL.THROTTLE reads one) becomes a bucket
        // hash: the string goes first, on the replicas too.
        if self.cell_string {
            self.delete()?;
            self.cell_string = false;
        }
        let recent = RECENT.get(self.ctx);
        let tok = match recent.tokens.take() {
            // The balance last kept (every new bucket of a tier writes
            // the same max - cost): its string again.
            Some((bits, kept)) if bits == tokens.to_bits() => kept,
            // Only a whole balance is kept: a refilled one is seldom
            // written twice, so it keeps the last whole one's place.
            last if tokens != (tokens as i64) as f64 => {
                recent.tokens.set(last);
                let tok = self.ctx.string(Text::tokens(tokens).as_bytes());
                return self.write_with(recent, &tok.ok_or(Step::HashSet)?, ts_us, expire_at_ms);
            }
            last => {
                if let Some((_, kept)) = last {
                    self.ctx.release(kept);
                }
                let tok = self.ctx.keep(Text::tokens(tokens).as_bytes());
                tok.ok_or(Step::HashSet)?
            }
        };
        let written = self.write_with(recent, &tok, ts_us, expire_at_ms);
        // A call made inside this one (by another module, on one of
        // its keyspace events) may have kept a string since.
        if let Some((_, other)) = recent.tokens.replace(Some((tokens.to_bits(), tok))) {
            self.ctx.release(other);
        }
        written
    }

    /// `write` with the `tokens` string made.
    fn write_with(
        &mut self,
        recent: &Recent,
        tok: &impl RString,
        ts_us: i64,
        expire_at_ms: i64,
    ) -> Result<(), Step> {
        let (ctx, name) = (self.ctx, self.key.name());
        let [tokens_field, ts_field] = FIELDS.get().ok_or(Step::HashSet)?;
        let ts = ctx
            .string(Text::int_after(ts_us, &recent.ts).as_bytes())
            .ok_or(Step::HashSet)?;
        if injected(Fault::HashSet) || !self.key.hash_set(tokens_field, tok, ts_field, &ts) {
            return Err(Step::HashSet);
        }
        // The events a plain HSET + PEXPIREAT would raise, as replicas and
        // the Lua fallback raise them.
        ctx.notify(true, c"hset", &name);
        let expired = !injected(Fault::Expire) && self.key.set_abs_expire(expire_at_ms);
        if !self.replicate(c"HSET", &[&name, tokens_field, tok, ts_field, &ts]) {
            return Err(Step::ReplicateHashSet);
        }
        if !expired {
            // The hash changed here and, through the HSET above, on the
            // replicas: both keep the old expire time.
            return Err(Step::Expire);
        }
        ctx.notify(false, c"expire", &name);
        // Only the replication needs the time as text: Redis copies it from
        // the stack (format `l` would take two allocations, a string made
        // here one more call and a free).
        let at = Text::int_after(expire_at_ms, &recent.expire_at);
        if !ctx.replicate_key_bytes(effect(c"PEXPIREAT"), &name, at.as_bytes()) {
            return Err(Step::ReplicateExpire);
        }
        Ok(())
    }

    fn delete(&mut self) -> Result<(), Step> {
        delete(self.ctx, &mut self.key)
    }

    #[inline]
    fn replicate(&self, command: &CStr, args: &[&dyn RString]) -> bool {
        replicate(self.ctx, command, args)
    }
}

/// An open key that should hold leases (TB.ACQUIRE and friends), for one
/// lease id. Closed on drop.
pub struct LeaseKey<'c> {
    key: Key<'c>,
    ctx: &'c Ctx,
    id: Option<ArgString<'c>>,
}

impl<'c> LeaseKey<'c> {
    /// Opens `name` for a call about `id` (none: TB.INFLIGHT), for reading,
    /// or for reading and writing (see `BucketKey::open`: nothing is
    /// signalled unless a write happens).
    pub fn open(ctx: &'c Ctx, name: ArgString<'c>, id: Option<ArgString<'c>>, write: bool) -> Self {
        LeaseKey {
            key: ctx.open_key(name, write),
            ctx,
            id,
        }
    }

    /// Carries out a lease call's write, and replicates it, effect by
    /// effect in the order `lease::Write` gives. `Err` names the step that
    /// failed; nothing else is attempted after it.
    pub fn apply(&mut self, write: &lease::Write) -> Result<(), Step> {
        let (ctx, name) = (self.ctx, self.key.name());
        match write {
            lease::Write::Delete => delete(ctx, &mut self.key)?,
            lease::Write::Save {
                expire_first,
                own,
                summary,
                list,
                delete,
                expire_at_ms,
            } => {
                for part in lease::Write::order(*expire_first) {
                    match part {
                        lease::Part::Set => self.set(*own, summary.as_deref(), list.as_deref())?,
                        lease::Part::Remove => self.remove(delete)?,
                        lease::Part::Expire => self.expire(*expire_at_ms)?,
                    }
                }
            }
        }
        ctx.signal_modified(&name);
        Ok(())
    }

    /// `HSET key id <own> "" <summary> <list field> <list>`, each if
    /// given, as one effect.
    fn set(
        &mut self,
        own: Option<lease::Lease>,
        summary: Option<&[u8]>,
        list: Option<&[u8]>,
    ) -> Result<(), Step> {
        let (ctx, name) = (self.ctx, self.key.name());
        let own = match (own, self.id) {
            (Some(lease), Some(id)) => Some((id, ctx.string(&lease.text()).ok_or(Step::HashSet)?)),
            (Some(_), None) => return Err(Step::HashSet),
            (None, _) => None,
        };
        let [summary_field, list_field] = SUMMARY.get().ok_or(Step::HashSet)?;
        let text = |t: Option<&[u8]>| t.map(|t| ctx.string(t).ok_or(Step::HashSet)).transpose();
        let (summary, list) = (text(summary)?, text(list)?);
        let mut pairs: Vec<(&dyn RString, &dyn RString)> = Vec::with_capacity(3);
        if let Some((id, value)) = &own {
            pairs.push((id, value));
        }
        if let Some(value) = &summary {
            pairs.push((summary_field, value));
        }
        if let Some(value) = &list {
            pairs.push((list_field, value));
        }
        if pairs.is_empty() {
            return Ok(());
        }
        if injected(Fault::HashSet) || !self.key.hash_set_pairs(&pairs) {
            return Err(Step::HashSet);
        }
        let mut args: Vec<&dyn RString> = Vec::with_capacity(1 + 2 * pairs.len());
        args.push(&name);
        for (field, value) in &pairs {
            args.extend([*field, *value]);
        }
        ctx.notify(true, c"hset", &name);
        if !replicate(ctx, c"HSET", &args) {
            return Err(Step::ReplicateHashSet);
        }
        Ok(())
    }

    fn expire(&mut self, at_ms: i64) -> Result<(), Step> {
        expire(self.ctx, &mut self.key, at_ms)
    }

    /// `HDEL key fields...`, as one effect.
    fn remove(&mut self, fields: &[Vec<u8>]) -> Result<(), Step> {
        if fields.is_empty() {
            return Ok(());
        }
        let (ctx, name) = (self.ctx, self.key.name());
        let mut strings = Vec::with_capacity(fields.len());
        for field in fields {
            strings.push(ctx.string(field).ok_or(Step::HashDelete)?);
        }
        let mut args: Vec<&dyn RString> = Vec::with_capacity(strings.len() + 1);
        args.push(&name);
        for field in &strings {
            args.push(field);
        }
        for (field, bytes) in args[1..].iter().zip(fields) {
            if injected(Fault::HashDelete) {
                return Err(Step::HashDelete);
            }
            // The list field can be missing from a key edited by hand (a
            // call that needs no list never reads it): deleting it is then
            // a no-op, as in HDEL.
            if !self.key.hash_delete_field(*field) && bytes.as_slice() != LIST_FIELD {
                return Err(Step::HashDelete);
            }
        }
        ctx.notify(true, c"hdel", &name);
        if !replicate(ctx, c"HDEL", &args) {
            return Err(Step::ReplicateHashDelete);
        }
        Ok(())
    }
}

/// How the lease decisions read the key: a missing key holds none, a hash
/// must hold leases, anything else is WRONGTYPE (`KeyKind::Other`).
impl LeaseStore for LeaseKey<'_> {
    fn kind(&self) -> KeyKind {
        self.key.kind()
    }

    /// The summary and the lease of the id this key was opened for, in
    /// one HashGet (`_id` is that id's bytes), and the list when the call
    /// needs it, in another.
    fn with_summary<R>(
        &self,
        _id: Option<&[u8]>,
        f: impl for<'x> FnOnce(Option<&'x [u8]>, Option<&'x [u8]>, ListField<'x>) -> R,
    ) -> R {
        // `init` made the names before any command was registered.
        let Some([summary, list]) = SUMMARY.get() else {
            return f(None, None, ListField(&None));
        };
        let (summary, own) = match self.id {
            Some(id) => self.key.hash_get(summary, &id),
            None => (self.key.hash_get_field(summary), None),
        };
        let list = LazyList {
            key: &self.key,
            name: list,
            value: OnceCell::new(),
        };
        f(
            summary.as_ref().map(|s| s.bytes()),
            own.as_ref().map(|s| s.bytes()),
            ListField(&list),
        )
    }

    fn scan(&self, visit: impl FnMut(&[u8], &[u8]) -> Result<(), Error>) -> Result<(), Error> {
        self.key.scan_hash(visit)
    }
}

/// A lease key's list field, read on first use.
struct LazyList<'k, 'c> {
    key: &'k Key<'c>,
    name: &'k Interned,
    value: OnceCell<Option<OwnedString<'c>>>,
}

impl ListRead for LazyList<'_, '_> {
    fn read(&self) -> Option<&[u8]> {
        self.value
            .get_or_init(|| self.key.hash_get_field(self.name))
            .as_ref()
            .map(|s| s.bytes())
    }
}

/// An open key that should hold a quota (TB.QUOTA and friends). Closed on
/// drop.
pub struct QuotaKey<'c> {
    key: Key<'c>,
    ctx: &'c Ctx,
}

/// A quota key's two fields, as `quota::load` reads them.
struct UsedStart<'k, 'c>(&'k Key<'c>);

impl QuotaFields for UsedStart<'_, '_> {
    fn with_fields<R>(&self, f: impl FnOnce(Option<&[u8]>, Option<&[u8]>) -> R) -> R {
        let Some([used, start]) = QUOTA_FIELDS.get() else {
            return f(None, None);
        };
        let (used, start) = self.0.hash_get(used, start);
        f(
            used.as_ref().map(|s| s.bytes()),
            start.as_ref().map(|s| s.bytes()),
        )
    }
}

impl<'c> QuotaKey<'c> {
    /// Opens `name`, as `BucketKey::open` does (nothing is signalled
    /// unless a write happens).
    pub fn open(ctx: &'c Ctx, name: ArgString<'c>, write: bool) -> Self {
        QuotaKey {
            key: ctx.open_key(name, write),
            ctx,
        }
    }

    /// The stored quota, `None` for a missing key (nothing used).
    pub fn load(&self) -> Result<Option<quota::Stored>, Error> {
        quota::load(self.key.kind(), &UsedStart(&self.key))
    }

    /// Carries out a quota call's effect, and replicates it, as
    /// `BucketKey::apply` does: `HSET key used <u> start <s>` then
    /// `PEXPIREAT` at the period's end, or `DEL`.
    pub fn apply(&mut self, effect: &quota::Effect) -> Result<(), Step> {
        let (ctx, name) = (self.ctx, self.key.name());
        match *effect {
            quota::Effect::Nothing => return Ok(()),
            quota::Effect::Delete => delete(ctx, &mut self.key)?,
            quota::Effect::Save {
                used,
                start,
                expire_at_ms,
            } => {
                let [used_field, start_field] = QUOTA_FIELDS.get().ok_or(Step::HashSet)?;
                let text = |bytes: &[u8]| ctx.string(bytes).ok_or(Step::HashSet);
                let used = text(Text::tokens(used).as_bytes())?;
                let start = text(Text::int(start).as_bytes())?;
                if injected(Fault::HashSet)
                    || !self.key.hash_set(used_field, &used, start_field, &start)
                {
                    return Err(Step::HashSet);
                }
                ctx.notify(true, c"hset", &name);
                if !replicate(
                    ctx,
                    c"HSET",
                    &[&name, used_field, &used, start_field, &start],
                ) {
                    return Err(Step::ReplicateHashSet);
                }
                expire(ctx, &mut self.key, expire_at_ms)?;
            }
        }
        ctx.signal_modified(&name);
        Ok(())
    }
}

/// `PEXPIREAT key <ms>`, and its replication.
fn expire(ctx: &Ctx, key: &mut Key, at_ms: i64) -> Result<(), Step> {
    let name = key.name();
    let at = ctx
        .string(Text::int(at_ms).as_bytes())
        .ok_or(Step::Expire)?;
    if injected(Fault::Expire) || !key.set_abs_expire(at_ms) {
        return Err(Step::Expire);
    }
    ctx.notify(false, c"expire", &name);
    if !replicate(ctx, c"PEXPIREAT", &[&name, &at]) {
        return Err(Step::ReplicateExpire);
    }
    Ok(())
}

/// `DEL key`, and its replication.
fn delete(ctx: &Ctx, key: &mut Key) -> Result<(), Step> {
    let name = key.name();
    if injected(Fault::Delete) || !key.delete() {
        return Err(Step::Delete);
    }
    ctx.notify(false, c"del", &name);
    if !replicate(ctx, c"DEL", &[&name]) {
        return Err(Step::ReplicateDelete);
    }
    Ok(())
}

/// `Ctx::replicate`, of `effect(command)`.
#[inline]
fn replicate(ctx: &Ctx, command: &CStr, args: &[&dyn RString]) -> bool {
    ctx.replicate(effect(command), args)
}

/// The command an effect replicates as: `command`, but a test build can
/// name one that does not exist, which is how Replicate really fails.
fn effect(command: &CStr) -> &CStr {
    if injected(Fault::Replicate) {
        c"TB-NO-SUCH-COMMAND"
    } else {
        command
    }
}
