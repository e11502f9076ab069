//! A lease key as one call sees it ([`Leases`]), what each command does to
//! it, and what it then writes ([`Write`]).
//!
//! A key of at most [`TRACKED`] + 1 fields is read whole: a *pass*. A
//! larger one keeps a summary (stored.rs): the total weight and count,
//! how many leases it lists, a horizon, the latest expiry and the first
//! listed one; and in a list field of its own, the leases that expire
//! before the horizon, in ascending expiry then id. While the clock is
//! before the horizon, every lease that can have expired is listed, so
//! the live weight is the total less the listed leases that have
//! expired, and a call reads two fields: the summary and its own lease.
//! The list field, the long one, is read only by a call that needs a
//! listed lease, and written only when it changes. (Lua interns every
//! string it reads or makes, hashing each byte: the library's calls pay
//! for a long field on every read and write.) The list is read lease by
//! lease, only as far as the call needs:
//! past the ones that expired, up to the caller's own lease if it is
//! listed, up to where a new lease goes, as far as a denial's wait needs,
//! and whole only to drop a lease when one more would make it too long.
//! Each lease read is checked against the summary and the caller's own
//! lease. A summary that is missing, disagrees with what the call sees, or
//! whose horizon has passed is rebuilt by a pass, which writers then store
//! with what it pruned, so the next call is cheap again. The module and
//! the Lua library read and write the same way, so they write the same
//! text whatever order they read the hash in.

use super::stored::{
    entry, first_expiry, list_text, Header, Lease, Tracked, LIST_FIELD, SUMMARY_FIELD, TRACKED,
};
use super::Acquire;
use crate::charge::{consume_all_if, Item, State};
use crate::error::Error;
use crate::state::KeyKind;
use std::borrow::Cow;

/// How a lease key is read, by the module (src/keyspace.rs) and by the
/// tests' snapshots (testkit).
pub trait LeaseStore {
    /// What the key holds: its field count for a hash.
    fn kind(&self) -> KeyKind;
    /// Calls `f` with the values of the summary and of field `id`
    /// (`None`: absent), and a way to read the list's, which a call needs
    /// only now and then.
    fn with_summary<R>(
        &self,
        id: Option<&[u8]>,
        f: impl for<'x> FnOnce(Option<&'x [u8]>, Option<&'x [u8]>, ListField<'x>) -> R,
    ) -> R;
    /// Calls `visit(field, value)` for every field of the hash, until it
    /// returns `Err`, which is then the result.
    fn scan(&self, visit: impl FnMut(&[u8], &[u8]) -> Result<(), Error>) -> Result<(), Error>;
}

/// Reads the list field's value (`None`: absent): once, when a call first
/// needs a listed lease.
pub trait ListRead {
    fn read(&self) -> Option<&[u8]>;
}

/// A list field already read (stores in memory).
impl ListRead for Option<&[u8]> {
    fn read(&self) -> Option<&[u8]> {
        *self
    }
}

/// A store's way to read the list field.
#[derive(Clone, Copy)]
pub struct ListField<'x>(pub &'x dyn ListRead);

impl std::fmt::Debug for ListField<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ListField")
    }
}

/// The summary can't answer a call (its list breaks its grammar or
/// disagrees with the key): the call is decided again after a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unsure;

/// The command a call is, for what it writes and in which order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Acquire,
    Release,
    Renew,
    /// Read-only: never writes.
    Inflight,
}

/// Whole milliseconds from `now_us` until `at_us`, rounded up: waiting that
/// long always reaches it. 0 if it has passed.
pub fn ms_until(now_us: i64, at_us: i64) -> i64 {
    let us = at_us.saturating_sub(now_us).max(0);
    us / 1000 + i64::from(us % 1000 != 0)
}

/// The absolute expiry in ms of a key whose latest lease ends at `at_us`,
/// rounded up so the key never goes before its last lease.
pub fn key_expire_at_ms(at_us: i64) -> i64 {
    at_us.div_euclid(1000) + i64::from(at_us.rem_euclid(1000) != 0)
}

/// The expiry a lease taken or renewed at `now_us` for `lease_ms` gets:
/// never earlier than it had (a clock that stepped back must not shorten
/// it, and a renewal never does).
pub fn extended(own: Option<Lease>, now_us: i64, lease_ms: i64) -> i64 {
    let new = now_us.saturating_add(lease_ms.saturating_mul(1000));
    own.map_or(new, |l| l.expires_us.max(new))
}

/// The order of the list: by expiry, then id (bytes).
fn order<'t>(t: &'t Tracked) -> (i64, &'t [u8]) {
    (t.lease.expires_us, &t.id)
}

/// The listed leases: those read so far (live ones, in order; the expired
/// ones are set aside as read), and the text of the rest.
#[derive(Debug)]
struct List<'a> {
    read: Vec<Tracked<'a>>,
    /// `None`: the list field is missing, which a read finds out, or not
    /// read yet (`field`).
    rest: Option<&'a [u8]>,
    /// Reads the list field, if it is still to be read.
    field: Option<ListField<'a>>,
    /// How many leases `rest` holds, as the summary says.
    left: usize,
    /// The expiry of the last lease read, for the order.
    last_us: i64,
    /// The first lease's expiry, as the summary says, until it is read.
    first_us: Option<i64>,
    /// A lease was read off `rest`.
    consumed: bool,
}

impl List<'_> {
    fn new() -> Self {
        List {
            read: Vec::new(),
            rest: Some(b""),
            field: None,
            left: 0,
            last_us: i64::MIN,
            first_us: None,
            consumed: false,
        }
    }
}

/// A lease key at one instant, after the leases that expired are set
/// aside, with the changes the call makes.
#[derive(Debug)]
pub struct Leases<'a> {
    now_us: i64,
    id: Option<&'a [u8]>,
    /// The caller's lease, if live.
    own: Option<Lease>,
    /// What the caller's field holds, live or not (the summary must agree).
    own_stored: Option<Lease>,
    /// The live leases' total weight and number, the caller's included.
    weight: i64,
    count: i64,
    /// No live lease but the caller's expires after this (exact after a
    /// pass; the summary's bound otherwise).
    latest_others_us: i64,
    /// Every live lease expiring before this is in `list`; `None`: every
    /// live lease is.
    horizon_us: Option<i64>,
    list: List<'a>,
    /// Fields whose lease has expired: pruned by the next write.
    expired: Vec<Cow<'a, [u8]>>,
    /// The hash's fields when read, and its summary as stored.
    fields: usize,
    summary: Option<Cow<'a, [u8]>>,
    /// The list field as stored (as "" where the summary lists none).
    list_field: Option<Cow<'a, [u8]>>,
    /// The key was read whole.
    passed: bool,
    /// The caller's lease was set, or released.
    set_own: Option<Lease>,
    released: bool,
}

impl<'a> Leases<'a> {
    /// The key as its summary tells it, or `Ok(None)` where a pass must
    /// read it. `Err` if the caller's own field holds no lease.
    fn from_summary(
        fields: usize,
        summary: Option<&'a [u8]>,
        list: ListField<'a>,
        own: Option<&'a [u8]>,
        id: Option<&'a [u8]>,
        now_us: i64,
    ) -> Result<Option<Self>, Error> {
        let own_stored = own
            .map(|v| Lease::parse(v).ok_or(Error::NotALeaseKey))
            .transpose()?;
        let Some(h) = summary.and_then(Header::parse) else {
            return Ok(None);
        };
        // The fields: the leases, the summary and the list.
        let agrees = i64::try_from(fields).is_ok_and(|n| h.count == n - 2)
            && h.listed as i64 <= h.count
            && h.weight >= h.count
            && h.latest_us >= h.horizon_us
            && (if h.listed == 0 {
                h.first_us == h.horizon_us
            } else {
                h.first_us < h.horizon_us
            })
            && own_stored.is_none_or(|l| {
                // The caller's lease is one of `count`, each of weight 1 or more.
                l.expires_us <= h.latest_us && h.count >= 1 && l.weight + h.count - 1 <= h.weight
            });
        if !agrees || now_us >= h.horizon_us {
            return Ok(None);
        }
        let mut view = Leases {
            now_us,
            id,
            own: own_stored.filter(|l| l.is_live(now_us)),
            own_stored,
            weight: h.weight,
            count: h.count,
            latest_others_us: h.latest_us,
            horizon_us: Some(h.horizon_us),
            // A summary that lists none is not answered by its list field.
            list: List {
                rest: if h.listed == 0 { Some(b"") } else { None },
                field: (h.listed > 0).then_some(list),
                left: h.listed,
                first_us: Some(h.first_us),
                ..List::new()
            },
            expired: Vec::new(),
            fields,
            summary: summary.map(Cow::Borrowed),
            list_field: (h.listed == 0).then_some(Cow::Borrowed(b"")),
            passed: false,
            set_own: None,
            released: false,
        };
        // The list answers for the leases that expired (at its head), and
        // for the caller's, if listed.
        if h.listed > 0 && h.first_us <= now_us && view.read_past_expired().is_err() {
            return Ok(None);
        }
        if own_stored.is_some_and(|l| view.listed(l)) && view.find_own().is_err() {
            return Ok(None);
        }
        Ok(Some(view))
    }

    /// The key read whole: every field visited once.
    fn pass(store: &impl LeaseStore, id: Option<&'a [u8]>, now_us: i64) -> Result<Self, Error> {
        let fields = match store.kind() {
            KeyKind::Missing => 0,
            KeyKind::Hash(n) => n,
            KeyKind::Other => return Err(Error::WrongType),
        };
        let mut view = Leases {
            now_us,
            id,
            own: None,
            own_stored: None,
            weight: 0,
            count: 0,
            latest_others_us: 0,
            horizon_us: None,
            list: List::new(),
            expired: Vec::new(),
            fields,
            summary: None,
            list_field: None,
            passed: true,
            set_own: None,
            released: false,
        };
        // The TRACKED + 1 earliest live leases, in ascending expiry.
        let mut earliest: Vec<Tracked<'a>> = Vec::with_capacity(TRACKED + 1);
        if fields > 0 {
            store.scan(|field, value| {
                if field == SUMMARY_FIELD {
                    view.summary = Some(Cow::Owned(value.to_vec()));
                    return Ok(());
                }
                if field == LIST_FIELD {
                    view.list_field = Some(Cow::Owned(value.to_vec()));
                    return Ok(());
                }
                let lease = Lease::parse(value).ok_or(Error::NotALeaseKey)?;
                if !lease.is_live(now_us) {
                    view.expired.push(Cow::Owned(field.to_vec()));
                    return Ok(());
                }
                // At most 1e6 leases... of weight at most 1e6 each per
                // limit; a hostile key could hold more: saturate.
                view.weight = view.weight.saturating_add(lease.weight);
                view.count += 1;
                if id == Some(field) {
                    view.own = Some(lease);
                } else {
                    view.latest_others_us = view.latest_others_us.max(lease.expires_us);
                }
                // In ascending expiry, then id: one order, whatever order
                // the hash is read in.
                let this = (lease.expires_us, field);
                let full = earliest.len() > TRACKED;
                if !full || earliest.last().is_some_and(|t| this < order(t)) {
                    if full {
                        earliest.pop();
                    }
                    let at = earliest.partition_point(|t| order(t) < this);
                    earliest.insert(at, Tracked::new(lease, Cow::Owned(field.to_vec())));
                }
                Ok(())
            })?;
        }
        view.own_stored = view.own;
        if earliest.len() > TRACKED {
            let horizon = earliest[TRACKED].lease.expires_us;
            earliest.retain(|t| t.lease.expires_us < horizon);
            view.horizon_us = Some(horizon);
        }
        view.list.read = earliest;
        Ok(view)
    }

    /// Reads the next listed lease: set aside if it has expired, else kept
    /// in `read`. False if none is left. `Unsure` if it breaks the
    /// grammar, the order or the horizon, disagrees with the caller's own
    /// lease, or leaves the totals impossible.
    fn read_one(&mut self) -> Result<bool, Unsure> {
        if let Some(read) = self.list.field.take() {
            self.list.rest = read.0.read();
            self.list_field = self.list.rest.map(Cow::Borrowed);
        }
        let list = &mut self.list;
        let text = list.rest.ok_or(Unsure)?;
        if list.left == 0 {
            return if text.is_empty() {
                Ok(false)
            } else {
                Err(Unsure)
            };
        }
        let (t, rest) = entry(text).ok_or(Unsure)?;
        let e = t.lease.expires_us;
        let before_horizon = self.horizon_us.is_some_and(|h| e < h);
        // The caller's lease is listed only as stored; the first lease as
        // the summary says.
        let own_agrees = Some(&*t.id) != self.id || self.own_stored == Some(t.lease);
        let first_agrees = list.first_us.take().is_none_or(|f| f == e);
        if e < list.last_us || !before_horizon || !own_agrees || !first_agrees {
            return Err(Unsure);
        }
        (list.rest, list.left, list.last_us) = (Some(rest), list.left - 1, e);
        list.consumed = true;
        if t.lease.is_live(self.now_us) {
            list.read.push(t);
        } else {
            self.weight -= t.lease.weight;
            self.count -= 1;
            self.expired.push(t.id);
            if self.count < 0 || self.weight < self.count {
                return Err(Unsure);
            }
        }
        Ok(true)
    }

    /// Reads the listed leases that have expired, and the first live one.
    fn read_past_expired(&mut self) -> Result<(), Unsure> {
        while self.list.read.is_empty() && self.read_one()? {}
        Ok(())
    }

    /// Reads the list up to where `(expires_us, id)` goes: the index of the
    /// first lease read that comes after it (or every lease's count).
    fn read_up_to(&mut self, key: (i64, &[u8])) -> Result<usize, Unsure> {
        loop {
            let at = self.list.read.partition_point(|t| order(t) < key);
            if at < self.list.read.len() || !self.read_one()? {
                return Ok(at);
            }
        }
    }

    /// Where the caller's listed lease is in `read` (`None`: it expired,
    /// and is set aside with the others); `Unsure` if it is not listed
    /// where it must be.
    fn find_own(&mut self) -> Result<Option<usize>, Unsure> {
        let (Some(own), Some(id)) = (self.own_stored, self.id) else {
            return Err(Unsure);
        };
        if !own.is_live(self.now_us) {
            self.read_past_expired()?;
            return match self.expired.iter().any(|f| **f == *id) {
                true => Ok(None),
                false => Err(Unsure),
            };
        }
        let at = self.read_up_to((own.expires_us, id))?;
        match self.list.read.get(at) {
            Some(t) if *t.id == *id => Ok(Some(at)),
            _ => Err(Unsure),
        }
    }

    /// The caller's live lease.
    pub fn own(&self) -> Option<Lease> {
        self.own
    }

    /// The live weight.
    pub fn in_use(&self) -> i64 {
        self.weight
    }

    /// The live weight of the leases other than the caller's.
    fn others_weight(&self) -> i64 {
        self.weight - self.own.map_or(0, |l| l.weight)
    }

    /// Whether a lease of `weight` fits beside the others under `limit`.
    pub fn fits(&self, limit: i64, weight: i64) -> bool {
        self.others_weight() + weight <= limit
    }

    /// Whether a lease expiring then is in the list.
    fn listed(&self, lease: Lease) -> bool {
        self.horizon_us.is_none_or(|h| lease.expires_us < h)
    }

    /// How long until enough leases other than the caller's expire for
    /// `weight` to fit under `limit` (0 if it fits now): exact where the
    /// list holds the leases whose expiry makes room, else the time until
    /// the horizon, before which no unlisted lease expires. Never later
    /// than the room appears by expiry. Reads the list only as far as it
    /// needs.
    pub fn wait_for_room(&mut self, limit: i64, weight: i64) -> Result<i64, Unsure> {
        let mut excess = self.others_weight() + weight - limit;
        if excess <= 0 {
            return Ok(0);
        }
        let mut at = 0;
        loop {
            let Some(t) = self.list.read.get(at) else {
                if self.read_one()? {
                    continue;
                }
                // With no horizon every lease is listed, and weight <=
                // limit: the loop returns before.
                return Ok(self.horizon_us.map_or(0, |h| ms_until(self.now_us, h)));
            };
            at += 1;
            if Some(&*t.id) != self.id {
                excess -= t.lease.weight;
                if excess <= 0 {
                    return Ok(ms_until(self.now_us, t.lease.expires_us));
                }
            }
        }
    }

    /// Takes or renews the caller's lease as `lease`.
    pub fn set_own(&mut self, lease: Lease) -> Result<(), Unsure> {
        let old = self.own;
        if old.is_some_and(|l| self.listed(l)) {
            if let Some(at) = self.find_own()? {
                self.list.read.remove(at);
            }
        }
        if self.listed(lease) {
            let id = self.id.unwrap_or_default();
            let at = self.read_up_to((lease.expires_us, id))?;
            self.list
                .read
                .insert(at, Tracked::new(lease, Cow::Borrowed(id)));
            if self.list.read.len() + self.list.left > TRACKED {
                self.keep_list_short()?;
            }
        }
        self.weight += lease.weight - old.map_or(0, |l| l.weight);
        self.count += i64::from(old.is_none());
        self.own = Some(lease);
        self.set_own = Some(lease);
        Ok(())
    }

    /// Releases the caller's lease; false if it had none.
    pub fn release_own(&mut self) -> Result<bool, Unsure> {
        let Some(old) = self.own else {
            return Ok(false);
        };
        if self.listed(old) {
            if let Some(at) = self.find_own()? {
                self.list.read.remove(at);
            }
        }
        self.weight -= old.weight;
        self.count -= 1;
        self.own = None;
        self.released = true;
        Ok(true)
    }

    /// Reads the whole list, then drops its latest leases past TRACKED, and
    /// the horizon with them: every lease expiring before it stays listed.
    fn keep_list_short(&mut self) -> Result<(), Unsure> {
        while self.read_one()? {}
        let list = &mut self.list.read;
        while list.len() > TRACKED {
            let Some(last) = list.last().map(|t| t.lease.expires_us) else {
                break;
            };
            list.retain(|t| t.lease.expires_us < last);
            self.horizon_us = Some(last);
        }
        Ok(())
    }

    /// The latest live lease's expiry, as far as the call knows.
    fn latest_us(&self) -> i64 {
        self.latest_others_us
            .max(self.own.map_or(0, |l| l.expires_us))
    }

    /// The summary the key needs now, if it holds more than TRACKED
    /// leases, and its list: the leases read, then the list's text not
    /// read, as stored (`None`: the call left the list as it found it).
    /// A pass of a key of TRACKED + 1 leases whose earliest share one
    /// expiry lists none, so the horizon is always set here.
    fn summary_now(&self) -> Option<(Vec<u8>, Option<Vec<u8>>)> {
        if self.count <= TRACKED as i64 {
            return None;
        }
        let horizon_us = self.horizon_us?;
        let list = &self.list;
        // A list the call did not read or change is left as stored.
        let touched = self.passed || list.consumed || !list.read.is_empty();
        let (first_us, text) = if touched {
            let rest = list.rest.unwrap_or_default();
            let first = match list.read.first() {
                Some(t) => Some(t.lease.expires_us),
                None if list.left > 0 => first_expiry(rest),
                None => Some(horizon_us),
            };
            // A rest whose first expiry can't be read is written with the
            // horizon as its first, which the next call finds wrong: it
            // passes, and the pass rebuilds the list.
            let text = list_text(&list.read, rest);
            (first.unwrap_or(horizon_us), Some(text))
        } else {
            (list.first_us.unwrap_or(horizon_us), None)
        };
        let header = Header {
            weight: self.weight,
            count: self.count,
            listed: list.read.len() + list.left,
            horizon_us,
            latest_us: self.latest_us(),
            first_us,
        };
        Some((header.text(), text))
    }

    /// What the call writes: its own change, and after a pass of a key
    /// that keeps a summary (more than TRACKED + 1 fields) what the pass
    /// found, so the next call need not pass again. A key of fewer fields
    /// is written only when a lease changes, as every call reads it whole.
    fn write(&self, kind: Kind) -> Option<Write> {
        let changed = self.set_own.is_some() || self.released;
        // A call that changed nothing writes only what its pass found.
        if kind == Kind::Inflight || !(changed || self.passed && self.fields > TRACKED + 1) {
            return None;
        }
        let (summary, list) = self
            .summary_now()
            .map_or((None, None), |(s, l)| (Some(s), l));
        let stored = self.summary.as_deref();
        let list = list.filter(|l| Some(&l[..]) != self.list_field.as_deref());
        // A key that no longer needs its summary loses both fields.
        let drop = summary.is_none() && (stored.is_some() || self.list_field.is_some());
        let found = self.passed
            && self.fields > TRACKED + 1
            && (!self.expired.is_empty() || summary.as_deref() != stored || list.is_some() || drop);
        if !changed && !found {
            return None;
        }
        if self.count == 0 {
            return Some(Write::Delete);
        }
        // The caller's expired lease is overwritten, not deleted, when set.
        let overwritten = |f: &&Cow<[u8]>| self.set_own.is_some() && Some(&***f) == self.id;
        let mut delete: Vec<Vec<u8>> = self
            .expired
            .iter()
            .filter(|f| !overwritten(f))
            .map(|f| f.to_vec())
            .collect();
        if self.released {
            delete.push(self.id.unwrap_or_default().to_vec());
        }
        if drop {
            delete.push(SUMMARY_FIELD.to_vec());
            delete.push(LIST_FIELD.to_vec());
        }
        Some(Write::Save {
            expire_first: kind != Kind::Acquire,
            own: self.set_own,
            summary: summary.filter(|s| Some(&s[..]) != stored),
            list,
            delete,
            expire_at_ms: key_expire_at_ms(self.latest_us()),
        })
    }
}

/// What a lease call writes to its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// No lease is left: `DEL key`.
    Delete,
    /// `HSET key id <own> "" <summary> <list field> <list>` (each if
    /// given), `HDEL key <delete>...` (expired leases' fields, the released
    /// id, the summary and list a key no longer needs), and `PEXPIREAT key <expire_at_ms>`, the
    /// latest lease's end rounded up. TB.ACQUIRE's HSET goes first: under
    /// maxmemory an EVAL is refused its first write only, so the EVAL
    /// script's acquire is then refused before it writes anything, as
    /// TB.ACQUIRE is. TB.RELEASE and TB.RENEW (`expire_first`), which run
    /// under maxmemory, start with PEXPIREAT, then HDEL, then HSET.
    Save {
        expire_first: bool,
        own: Option<Lease>,
        summary: Option<Vec<u8>>,
        list: Option<Vec<u8>>,
        delete: Vec<Vec<u8>>,
        expire_at_ms: i64,
    },
}

/// One of a `Write::Save`'s effects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// `HSET` of the caller's lease and the summary.
    Set,
    /// `HDEL` of the fields to delete.
    Remove,
    /// `PEXPIREAT`.
    Expire,
}

impl Write {
    /// The order a `Save`'s effects go in (see `Save`).
    pub fn order(expire_first: bool) -> [Part; 3] {
        if expire_first {
            [Part::Expire, Part::Remove, Part::Set]
        } else {
            [Part::Set, Part::Remove, Part::Expire]
        }
    }
}

/// Decides a call on `store` for `id` at `now_us`: `op` runs on the key as
/// its summary tells it, or on the key read whole where the summary can't
/// answer. The result is `op`'s, and what to write.
pub fn decide<T>(
    store: &impl LeaseStore,
    id: Option<&[u8]>,
    now_us: i64,
    kind: Kind,
    mut op: impl FnMut(&mut Leases) -> Result<T, Unsure>,
) -> Result<(T, Option<Write>), Error> {
    if let KeyKind::Hash(fields) = store.kind() {
        if fields > TRACKED + 1 {
            let fast = store.with_summary(id, |summary, own, list| {
                let Some(mut view) = Leases::from_summary(fields, summary, list, own, id, now_us)?
                else {
                    return Ok(None);
                };
                Ok(op(&mut view).ok().map(|t| (t, view.write(kind))))
            })?;
            if let Some(done) = fast {
                return Ok(done);
            }
        }
    }
    let mut view = Leases::pass(store, id, now_us)?;
    // A pass reads the list it builds: op can't be unsure of it.
    let t = op(&mut view).map_err(|Unsure| Error::Internal("a pass left its lease list unread"))?;
    Ok((t, view.write(kind)))
}

/// TB.ACQUIRE's reply: whether it was acquired, its four numbers, and one
/// outcome per bucket (charged only if acquired by a new lease).
#[derive(Clone, Debug, PartialEq)]
pub struct Acquired {
    pub acquired: bool,
    pub head: [i64; 4],
    /// Each clause's reply and write.
    pub items: Vec<Item>,
}

/// TB.ACQUIRE: the lease and every clause (bucket or quota), or nothing.
/// A live lease of the same id (a retry) is renewed with the new weight,
/// counted once and charges no clause: their replies are what TB.PEEK and
/// TB.QPEEK would answer. `states` are the clauses' keys, as read.
pub fn acquire(view: &mut Leases, call: &Acquire, states: &[State]) -> Result<Acquired, Unsure> {
    let (limit, lease_ms, weight) = (call.limit, call.lease_ms, call.weight);
    let now = view.now_us;
    let retry = view.own.is_some();
    let fits = view.fits(limit, weight);
    let (pay, bucket_wait, items) = consume_all_if(&call.clauses, states, now, fits && !retry);
    let acquired = fits && (retry || pay);
    let head = if acquired {
        let lease = Lease {
            expires_us: extended(view.own, now, lease_ms),
            weight,
        };
        view.set_own(lease)?;
        [1, view.in_use(), 0, ms_until(now, lease.expires_us)]
    } else {
        let lease_wait = if fits {
            0
        } else {
            view.wait_for_room(limit, weight)?
        };
        let bucket_wait = if retry { 0 } else { bucket_wait };
        [0, view.in_use(), lease_wait.max(bucket_wait), 0]
    };
    Ok(Acquired {
        acquired,
        head,
        items,
    })
}

/// TB.RELEASE: `[released, in_use]`.
pub fn release(view: &mut Leases) -> Result<[i64; 2], Unsure> {
    let released = view.release_own()?;
    Ok([i64::from(released), view.in_use()])
}

/// TB.RENEW: `[renewed, expires_in_ms]`. A lease that is not live is never
/// recreated.
pub fn renew(view: &mut Leases, lease_ms: i64) -> Result<[i64; 2], Unsure> {
    let Some(own) = view.own else {
        return Ok([0, 0]);
    };
    let lease = Lease {
        expires_us: extended(Some(own), view.now_us, lease_ms),
        weight: own.weight,
    };
    view.set_own(lease)?;
    Ok([1, ms_until(view.now_us, lease.expires_us)])
}
