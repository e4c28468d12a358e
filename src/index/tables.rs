//! The tables, once: their redb definitions, their owned key and value types, and how a
//! key or value is written in a log record. Everything generic over tables (the
//! memtable, layered reads, checkpoints) goes through [`Table`].

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;

use redb::TableDefinition;
use smol_str::SmolStr;

/// A key type: owned, ordered exactly as redb orders its stored form (strings by their
/// UTF-8 bytes, tuples element by element), so that a memtable and redb merge in order.
pub(crate) trait TableKey: Ord + Clone + Send + Sync + fmt::Debug + 'static {
    /// The redb key type.
    type Redb: redb::Key + Send + Sync + 'static;
    fn own(k: <Self::Redb as redb::Value>::SelfType<'_>) -> Self;
    fn borrow(&self) -> <Self::Redb as redb::Value>::SelfType<'_>;
    /// How it orders against a key as redb stores it, without owning that one.
    fn cmp_stored(&self, stored: &<Self::Redb as redb::Value>::SelfType<'_>) -> Ordering;
    /// Bytes it takes in memory, roughly (for the memtable's bound).
    fn size(&self) -> usize;
    fn encode(&self, out: &mut Vec<u8>);
    fn decode(r: &mut Bytes<'_>) -> Option<Self>;
    /// How findings and messages show it.
    fn show(&self) -> String;
    /// Writes the key so that byte order is key order (for stores that compare keys as
    /// bytes): integers big-endian, strings with each 0x00 as 0x00 0xFF and ended by
    /// 0x00 0x00, so a string sorts before every longer string it begins.
    fn to_ordered(&self, out: &mut Vec<u8>);
    /// Reads a key written by [`TableKey::to_ordered`]; `None` for bytes it did not write.
    fn from_ordered(r: &mut Bytes<'_>) -> Option<Self>;
    /// The key as a sequence number, for the tables keyed by one (deferred purges hide
    /// such keys: see `purged`).
    fn seq(&self) -> Option<u64> {
        None
    }
}

/// A value type: framed record bytes, or nothing (set-like index tables).
pub(crate) trait TableValue: Clone + Send + Sync + fmt::Debug + 'static {
    type Redb: redb::Value + Send + Sync + 'static;
    fn own(v: <Self::Redb as redb::Value>::SelfType<'_>) -> Self;
    fn borrow(&self) -> <Self::Redb as redb::Value>::SelfType<'_>;
    fn size(&self) -> usize;
    fn encode(&self, out: &mut Vec<u8>);
    fn decode(r: &mut Bytes<'_>) -> Option<Self>;
    /// The value as a store of bytes keeps it (a record's bytes; nothing for `()`).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn raw(&self) -> &[u8];
    /// The value from the bytes [`TableValue::raw`] gave.
    fn from_raw(b: &[u8]) -> Self;
}

/// One table of the journal.
pub(crate) trait Table: 'static {
    const NAME: &'static str;
    /// Its number in log records.
    const ID: u8;
    type K: TableKey;
    type V: TableValue;
    fn def() -> TableDefinition<'static, <Self::K as TableKey>::Redb, <Self::V as TableValue>::Redb>;
    fn map(m: &Memtable) -> &BTreeMap<Self::K, Option<Self::V>>;
    fn map_mut(m: &mut Memtable) -> &mut BTreeMap<Self::K, Option<Self::V>>;
    fn staged_mut(s: &mut Staged) -> &mut Vec<(Self::K, Option<Self::V>)>;
}

/// Reads the fields of a log record's payload.
pub(crate) struct Bytes<'a> {
    buf: &'a [u8],
}

impl<'a> Bytes<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Bytes<'a> {
        Bytes { buf }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.buf.len() < n {
            return None;
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Some(head)
    }

    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    pub(crate) fn u32(&mut self) -> Option<u32> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Some(u32::from_le_bytes(a))
    }

    pub(crate) fn u64(&mut self) -> Option<u64> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Some(u64::from_le_bytes(a))
    }

    pub(crate) fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    /// A string key: up to 23 bytes kept inline, without an allocation (operation ids,
    /// sessions and scopes mostly are).
    pub(crate) fn smol(&mut self) -> Option<SmolStr> {
        std::str::from_utf8(self.bytes()?).ok().map(SmolStr::new)
    }

    /// A big-endian u64 (see [`TableKey::to_ordered`]).
    pub(crate) fn u64_be(&mut self) -> Option<u64> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Some(u64::from_be_bytes(a))
    }

    /// A string written by [`put_ordered_str`], as a key. A string without 0x00 bytes (ids,
    /// sessions and scopes are) is its bytes up to the ending 0x00 0x00, read in place:
    /// no allocation for one of up to 23 bytes.
    pub(crate) fn ordered_smol(&mut self) -> Option<SmolStr> {
        let zero = self.buf.iter().position(|b| *b == 0)?;
        if self.buf.get(zero + 1) != Some(&0) {
            // An escaped 0x00 (or bytes this encoding never writes): the general reading.
            return self.ordered_str().map(SmolStr::from);
        }
        let s = std::str::from_utf8(self.take(zero)?).ok()?;
        self.take(2)?;
        Some(SmolStr::new(s))
    }

    /// A string written by [`put_ordered_str`].
    pub(crate) fn ordered_str(&mut self) -> Option<String> {
        let mut out = Vec::new();
        loop {
            match self.u8()? {
                0 => match self.u8()? {
                    0 => break,
                    0xFF => out.push(0),
                    _ => return None,
                },
                b => out.push(b),
            }
        }
        String::from_utf8(out).ok()
    }
}

/// Writes `s` so that byte order is string order, also as the first element of a tuple:
/// each 0x00 becomes 0x00 0xFF, and 0x00 0x00 ends it.
pub(crate) fn put_ordered_str(out: &mut Vec<u8>, s: &str) {
    for &b in s.as_bytes() {
        out.push(b);
        if b == 0 {
            out.push(0xFF);
        }
    }
    out.extend_from_slice(&[0, 0]);
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    // Keys and values are far below 4 GiB (the result ceiling is 64 MiB).
    out.extend_from_slice(&u32::try_from(b.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(b);
}

/// Memory a map entry costs besides its key and value, roughly.
pub(crate) const ENTRY_OVERHEAD: usize = 48;

impl TableKey for SmolStr {
    type Redb = &'static str;
    fn own(k: &str) -> Self {
        SmolStr::new(k)
    }
    fn borrow(&self) -> &str {
        self.as_str()
    }
    fn cmp_stored(&self, stored: &&str) -> Ordering {
        self.borrow().cmp(stored)
    }
    fn size(&self) -> usize {
        self.len() + 24
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_bytes(out, self.as_bytes());
    }
    fn decode(r: &mut Bytes<'_>) -> Option<Self> {
        r.smol()
    }
    fn show(&self) -> String {
        self.to_string()
    }
    fn to_ordered(&self, out: &mut Vec<u8>) {
        put_ordered_str(out, self);
    }
    fn from_ordered(r: &mut Bytes<'_>) -> Option<Self> {
        r.ordered_smol()
    }
}

impl TableKey for u64 {
    type Redb = u64;
    fn own(k: u64) -> Self {
        k
    }
    fn borrow(&self) -> u64 {
        *self
    }
    fn cmp_stored(&self, stored: &u64) -> Ordering {
        self.borrow().cmp(stored)
    }
    fn size(&self) -> usize {
        8
    }
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn decode(r: &mut Bytes<'_>) -> Option<Self> {
        r.u64()
    }
    fn show(&self) -> String {
        self.to_string()
    }
    fn to_ordered(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_be_bytes());
    }
    fn from_ordered(r: &mut Bytes<'_>) -> Option<Self> {
        r.u64_be()
    }
    fn seq(&self) -> Option<u64> {
        Some(*self)
    }
}

impl TableKey for (SmolStr, u64) {
    type Redb = (&'static str, u64);
    fn own(k: (&str, u64)) -> Self {
        (SmolStr::new(k.0), k.1)
    }
    fn borrow(&self) -> (&str, u64) {
        (self.0.as_str(), self.1)
    }
    fn cmp_stored(&self, stored: &(&str, u64)) -> Ordering {
        self.borrow().cmp(stored)
    }
    fn size(&self) -> usize {
        self.0.len() + 32
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_bytes(out, self.0.as_bytes());
        out.extend_from_slice(&self.1.to_le_bytes());
    }
    fn decode(r: &mut Bytes<'_>) -> Option<Self> {
        Some((r.smol()?, r.u64()?))
    }
    fn show(&self) -> String {
        format!("{} @ {}", self.0, self.1)
    }
    fn to_ordered(&self, out: &mut Vec<u8>) {
        put_ordered_str(out, &self.0);
        out.extend_from_slice(&self.1.to_be_bytes());
    }
    fn from_ordered(r: &mut Bytes<'_>) -> Option<Self> {
        Some((r.ordered_smol()?, r.u64_be()?))
    }
}

impl TableKey for (u8, u64, SmolStr) {
    type Redb = (u8, u64, &'static str);
    fn own(k: (u8, u64, &str)) -> Self {
        (k.0, k.1, SmolStr::new(k.2))
    }
    fn borrow(&self) -> (u8, u64, &str) {
        (self.0, self.1, self.2.as_str())
    }
    fn cmp_stored(&self, stored: &(u8, u64, &str)) -> Ordering {
        self.borrow().cmp(stored)
    }
    fn size(&self) -> usize {
        self.2.len() + 40
    }
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.0);
        out.extend_from_slice(&self.1.to_le_bytes());
        put_bytes(out, self.2.as_bytes());
    }
    fn decode(r: &mut Bytes<'_>) -> Option<Self> {
        Some((r.u8()?, r.u64()?, r.smol()?))
    }
    fn show(&self) -> String {
        let name = super::TimerKind::from_byte(self.0).map_or("?", super::TimerKind::name);
        format!("{name} {} {}", crate::clock::Timestamp(self.1), self.2)
    }
    fn to_ordered(&self, out: &mut Vec<u8>) {
        out.push(self.0);
        out.extend_from_slice(&self.1.to_be_bytes());
        put_ordered_str(out, &self.2);
    }
    fn from_ordered(r: &mut Bytes<'_>) -> Option<Self> {
        Some((r.u8()?, r.u64_be()?, r.ordered_smol()?))
    }
}

impl TableKey for (u64, u64) {
    type Redb = (u64, u64);
    fn own(k: (u64, u64)) -> Self {
        k
    }
    fn borrow(&self) -> (u64, u64) {
        *self
    }
    fn cmp_stored(&self, stored: &(u64, u64)) -> Ordering {
        self.borrow().cmp(stored)
    }
    fn size(&self) -> usize {
        16
    }
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.0.to_le_bytes());
        out.extend_from_slice(&self.1.to_le_bytes());
    }
    fn decode(r: &mut Bytes<'_>) -> Option<Self> {
        Some((r.u64()?, r.u64()?))
    }
    fn show(&self) -> String {
        format!("{} event {}", crate::clock::Timestamp(self.0), self.1)
    }
    fn to_ordered(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.0.to_be_bytes());
        out.extend_from_slice(&self.1.to_be_bytes());
    }
    fn from_ordered(r: &mut Bytes<'_>) -> Option<Self> {
        Some((r.u64_be()?, r.u64_be()?))
    }
}

impl TableKey for (SmolStr, u64, SmolStr) {
    type Redb = (&'static str, u64, &'static str);
    fn own(k: (&str, u64, &str)) -> Self {
        (SmolStr::new(k.0), k.1, SmolStr::new(k.2))
    }
    fn borrow(&self) -> (&str, u64, &str) {
        (self.0.as_str(), self.1, self.2.as_str())
    }
    fn cmp_stored(&self, stored: &(&str, u64, &str)) -> Ordering {
        self.borrow().cmp(stored)
    }
    fn size(&self) -> usize {
        self.0.len() + self.2.len() + 56
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_bytes(out, self.0.as_bytes());
        out.extend_from_slice(&self.1.to_le_bytes());
        put_bytes(out, self.2.as_bytes());
    }
    fn decode(r: &mut Bytes<'_>) -> Option<Self> {
        Some((r.smol()?, r.u64()?, r.smol()?))
    }
    fn show(&self) -> String {
        format!("{} {} {}", self.0, crate::clock::Timestamp(self.1), self.2)
    }
    fn to_ordered(&self, out: &mut Vec<u8>) {
        put_ordered_str(out, &self.0);
        out.extend_from_slice(&self.1.to_be_bytes());
        put_ordered_str(out, &self.2);
    }
    fn from_ordered(r: &mut Bytes<'_>) -> Option<Self> {
        Some((r.ordered_smol()?, r.u64_be()?, r.ordered_smol()?))
    }
}

impl TableKey for (SmolStr, SmolStr) {
    type Redb = (&'static str, &'static str);
    fn own(k: (&str, &str)) -> Self {
        (SmolStr::new(k.0), SmolStr::new(k.1))
    }
    fn borrow(&self) -> (&str, &str) {
        (self.0.as_str(), self.1.as_str())
    }
    fn cmp_stored(&self, stored: &(&str, &str)) -> Ordering {
        self.borrow().cmp(stored)
    }
    fn size(&self) -> usize {
        self.0.len() + self.1.len() + 48
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_bytes(out, self.0.as_bytes());
        put_bytes(out, self.1.as_bytes());
    }
    fn decode(r: &mut Bytes<'_>) -> Option<Self> {
        Some((r.smol()?, r.smol()?))
    }
    fn show(&self) -> String {
        format!("{} {}", self.0, self.1)
    }
    fn to_ordered(&self, out: &mut Vec<u8>) {
        put_ordered_str(out, &self.0);
        put_ordered_str(out, &self.1);
    }
    fn from_ordered(r: &mut Bytes<'_>) -> Option<Self> {
        Some((r.ordered_smol()?, r.ordered_smol()?))
    }
}

impl TableValue for Vec<u8> {
    type Redb = &'static [u8];
    fn own(v: &[u8]) -> Self {
        v.to_vec()
    }
    fn borrow(&self) -> &[u8] {
        self.as_slice()
    }
    fn size(&self) -> usize {
        self.len() + 24
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_bytes(out, self);
    }
    fn decode(r: &mut Bytes<'_>) -> Option<Self> {
        r.bytes().map(<[u8]>::to_vec)
    }
    fn raw(&self) -> &[u8] {
        self
    }
    fn from_raw(b: &[u8]) -> Self {
        b.to_vec()
    }
}

impl TableValue for () {
    type Redb = ();
    fn own(_: ()) -> Self {}
    fn borrow(&self) {}
    fn size(&self) -> usize {
        0
    }
    fn encode(&self, _: &mut Vec<u8>) {}
    fn decode(_: &mut Bytes<'_>) -> Option<Self> {
        Some(())
    }
    fn raw(&self) -> &[u8] {
        &[]
    }
    fn from_raw(_: &[u8]) -> Self {}
}

macro_rules! tables {
    ($( $(#[$doc:meta])* $ty:ident = ($name:literal, $id:literal, $field:ident, $K:ty, $V:ty); )*) => {
        $(
            $(#[$doc])*
            pub(crate) struct $ty;

            impl Table for $ty {
                const NAME: &'static str = $name;
                const ID: u8 = $id;
                type K = $K;
                type V = $V;
                fn def() -> TableDefinition<'static, <$K as TableKey>::Redb, <$V as TableValue>::Redb> {
                    TableDefinition::new($name)
                }
                fn map(m: &Memtable) -> &BTreeMap<$K, Option<$V>> {
                    &m.$field
                }
                fn map_mut(m: &mut Memtable) -> &mut BTreeMap<$K, Option<$V>> {
                    &mut m.$field
                }
                fn staged_mut(s: &mut Staged) -> &mut Vec<($K, Option<$V>)> {
                    &mut s.$field
                }
            }
        )*

        /// Changes read back from log records, in log order, per table: built into a
        /// [`Memtable`] at once by [`Staged::build`] (see there for why).
        #[derive(Default)]
        pub(crate) struct Staged {
            $( $field: Vec<($K, Option<$V>)>, )*
        }

        /// Changes to every table not yet in redb: a batch being written, or everything
        /// logged since the last checkpoint. `None` is a deletion.
        #[derive(Clone, Default, Debug)]
        pub(crate) struct Memtable {
            $( $field: BTreeMap<$K, Option<$V>>, )*
            /// Memory the entries take, roughly.
            bytes: usize,
            /// Entries held.
            entries: usize,
            /// Its deletions are of keys the index mostly holds (a compaction batch's):
            /// [`Memtable::absorb_over`] keeps their tombstones without asking.
            stored_deletions: bool,
        }

        /// Calls `$mac!(Table)` for every table, in log-record order.
        macro_rules! each_table {
            ($mac:ident) => { $( $mac!($ty); )* };
        }
        pub(crate) use each_table;

    };
}

tables! {
    /// `meta`: `"format"`, `"state"` and `"checkpoint"` records.
    Meta = ("meta", 1, meta, SmolStr, Vec<u8>);
    /// `events`: seq → event record. The source of truth.
    Events = ("events", 2, events, u64, Vec<u8>);
    /// `receipts`: operation id → receipt record (an index).
    Receipts = ("receipts", 3, receipts, SmolStr, Vec<u8>);
    /// `results`: seq of the completing event → result header and payload.
    Results = ("results", 4, results, u64, Vec<u8>);
    /// `scopes`: scope → its revision and the event that set it (an index).
    Scopes = ("scopes", 5, scopes, SmolStr, Vec<u8>);
    /// `op_events`: (operation id, seq) (an index).
    OpEvents = ("op_events", 6, op_events, (SmolStr, u64), ());
    /// `timers`: (timer kind, due ms, operation id) (an index).
    Timers = ("timers", 7, timers, (u8, u64, SmolStr), ());
    /// `scope_timers`: (due ms, seq of a superseded revision event) (an index).
    ScopeTimers = ("scope_timers", 8, scope_timers, (u64, u64), ());
    /// `windows`: (session, ack deadline ms, operation id) (an index).
    Windows = ("windows", 9, windows, (SmolStr, u64, SmolStr), ());
    /// `scope_holds`: (scope, operation id) (an index).
    Holds = ("scope_holds", 10, holds, (SmolStr, SmolStr), ());
    /// `in_doubt`: operation id (an index).
    InDoubt = ("in_doubt", 11, in_doubt, SmolStr, ());
    /// `quarantine`: n → a record `repair` could not use.
    Quarantine = ("quarantine", 12, quarantine, u64, Vec<u8>);
}

/// The tables whose deletions of keys the file lacks leave no tombstone (see
/// [`Memtable::absorb_over`]): ranges of them are read on every call.
const PRUNED_TOMBSTONES: [u8; 5] = [
    <Timers as Table>::ID,
    <ScopeTimers as Table>::ID,
    <Windows as Table>::ID,
    <Holds as Table>::ID,
    <InDoubt as Table>::ID,
];

/// Memory a memtable entry's key takes, with the entry's own overhead (roughly).
fn key_bytes(key: &impl TableKey) -> usize {
    key.size() + ENTRY_OVERHEAD
}

/// Memory a memtable entry's value (or deletion) takes, roughly.
fn value_bytes<V: TableValue>(value: &Option<V>) -> usize {
    value.as_ref().map_or(0, TableValue::size)
}

impl Memtable {
    /// Records `value` (or a deletion) for `key`.
    pub(crate) fn set<T: Table>(&mut self, key: T::K, value: Option<T::V>) {
        let key_size = key_bytes(&key);
        let value_size = value_bytes(&value);
        match T::map_mut(self).insert(key, value) {
            // The key was counted when it was first set; only the value changes.
            Some(old) => {
                let old_size = value_bytes(&old);
                self.bytes = (self.bytes + value_size).saturating_sub(old_size);
            }
            None => {
                self.bytes += key_size + value_size;
                self.entries += 1;
            }
        }
    }

    /// Whether it holds no change.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Memory the entries take, roughly.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Forgets `key` (its change, not a deletion of it).
    fn forget<T: Table>(&mut self, key: &T::K) {
        if let Some(old) = T::map_mut(self).remove(key) {
            self.bytes = self
                .bytes
                .saturating_sub(key_bytes(key) + value_bytes(&old));
            self.entries = self.entries.saturating_sub(1);
        }
    }

    /// As [`Memtable::absorb`], for the memtable right over `below` (a memtable being
    /// checkpointed, if any) and `base`: in the small index tables that calls read by range
    /// (timers, windows, holds, in-doubt), a deletion of a key that neither holds leaves no
    /// tombstone (it would only hide nothing, and reads of a range would step over it until
    /// the next checkpoint: a session's acknowledged window entries made every later submit
    /// slower). A key `below` sets needs the tombstone (a key it deletes does not), whatever
    /// `base` holds. Other tables keep the tombstone without asking (a lookup per deletion,
    /// most of a purge's cost: its events, result and receipt are always in `base`), and so
    /// do a compaction batch's ([`Memtable::deletes_stored_keys`]). When `base` cannot be
    /// read, the tombstone stays, which is always correct.
    pub(crate) fn absorb_over(
        &mut self,
        top: Memtable,
        base: Option<&super::layers::Base<'_>>,
        below: Option<&Memtable>,
    ) {
        let mut top = top;
        macro_rules! move_in {
            ($t:ident) => {
                let pruned = PRUNED_TOMBSTONES.contains(&<$t as Table>::ID);
                let ask_base = !top.stored_deletions;
                for (k, v) in std::mem::take(<$t as Table>::map_mut(&mut top)) {
                    let held_below = || match below.and_then(|m| <$t as Table>::map(m).get(&k)) {
                        Some(change) => change.is_some(),
                        // Without a base (a journal in memory) nothing lies below.
                        None => {
                            base.is_some_and(|b| !ask_base || b.contains::<$t>(&k).unwrap_or(true))
                        }
                    };
                    if v.is_none() && pruned && !held_below() {
                        self.forget::<$t>(&k);
                    } else {
                        self.set::<$t>(k, v);
                    }
                }
            };
        }
        each_table!(move_in);
    }

    /// Notes that its deletions are of keys the index mostly holds, as a compaction
    /// batch's are: [`Memtable::absorb_over`] then keeps their tombstones without a lookup
    /// each in redb (a pass deletes two timers per purged operation, and asking the base
    /// about each was a twentieth of the pass). A tombstone of a key the index lacks only
    /// costs range reads a step until the next checkpoint.
    pub(crate) fn deletes_stored_keys(&mut self) {
        self.stored_deletions = true;
    }

    /// Moves every change of `top` in, over this one's.
    pub(crate) fn absorb(&mut self, top: Memtable) {
        let mut top = top;
        macro_rules! move_in {
            ($t:ident) => {
                for (k, v) in std::mem::take(<$t as Table>::map_mut(&mut top)) {
                    self.set::<$t>(k, v);
                }
            };
        }
        each_table!(move_in);
    }

    /// Calls `f` with every change as a store of bytes writes it: the table's number, the
    /// key in byte order ([`TableKey::to_ordered`]), and the value's bytes (`None`: delete).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn each_raw(&self, mut f: impl FnMut(u8, Vec<u8>, Option<&[u8]>)) {
        macro_rules! raw {
            ($t:ident) => {
                for (k, v) in <$t as Table>::map(self) {
                    let mut key = Vec::new();
                    k.to_ordered(&mut key);
                    f(<$t as Table>::ID, key, v.as_ref().map(TableValue::raw));
                }
            };
        }
        each_table!(raw);
    }

    /// The changes as a log record's payload:
    ///
    /// ```text
    /// u32 count, then per change: u8 table, u8 op (1 put, 0 delete), key, [value]
    /// ```
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.bytes / 2 + 16);
        out.extend_from_slice(
            &u32::try_from(self.entries)
                .unwrap_or(u32::MAX)
                .to_le_bytes(),
        );
        macro_rules! enc {
            ($t:ident) => {
                for (k, v) in <$t as Table>::map(self) {
                    out.push(<$t as Table>::ID);
                    match v {
                        Some(v) => {
                            out.push(1);
                            k.encode(&mut out);
                            v.encode(&mut out);
                        }
                        None => {
                            out.push(0);
                            k.encode(&mut out);
                        }
                    }
                }
            };
        }
        each_table!(enc);
        out
    }

    /// Applies a log record's payload over this memtable.
    pub(crate) fn apply_encoded(&mut self, payload: &[u8]) -> Result<(), String> {
        decode_changes(payload, self)
    }
}

/// Where [`decode_changes`] puts each change it reads.
trait ChangeSink {
    fn put<T: Table>(&mut self, key: T::K, value: Option<T::V>);
}

impl ChangeSink for Memtable {
    fn put<T: Table>(&mut self, key: T::K, value: Option<T::V>) {
        self.set::<T>(key, value);
    }
}

impl ChangeSink for Staged {
    fn put<T: Table>(&mut self, key: T::K, value: Option<T::V>) {
        // A change of the key changed last replaces it: the build keeps the last change of
        // each key anyway, and a log rewrites a few keys every batch (the state record, a
        // busy scope, an operation's receipt from submit to acknowledgement), which would
        // otherwise be sorted and dropped by the thousand.
        let staged = T::staged_mut(self);
        match staged.last_mut() {
            Some(last) if last.0 == key => last.1 = value,
            _ => staged.push((key, value)),
        }
    }
}

/// Reads a log record's payload (see [`Memtable::encode`]) into `sink`, change by change.
/// On an error some changes may be in `sink` already: callers discard it.
fn decode_changes(payload: &[u8], sink: &mut impl ChangeSink) -> Result<(), String> {
    let mut r = Bytes::new(payload);
    let count = r.u32().ok_or("the batch has no count")?;
    for i in 0..count {
        let bad = || format!("change {i} of {count} does not decode");
        let id = r.u8().ok_or_else(bad)?;
        let op = r.u8().ok_or_else(bad)?;
        if op > 1 {
            return Err(format!("change {i} has operation {op}"));
        }
        macro_rules! dec {
            ($t:ident) => {
                if id == <$t as Table>::ID {
                    let k = <<$t as Table>::K as TableKey>::decode(&mut r).ok_or_else(bad)?;
                    let v = if op == 1 {
                        Some(<<$t as Table>::V as TableValue>::decode(&mut r).ok_or_else(bad)?)
                    } else {
                        None
                    };
                    sink.put::<$t>(k, v);
                    continue;
                }
            };
        }
        each_table!(dec);
        return Err(format!("change {i} names table {id}, which does not exist"));
    }
    if !r.is_empty() {
        return Err("bytes follow the batch's last change".into());
    }
    Ok(())
}

impl Staged {
    /// Adds a log record's changes (the next record in log order).
    pub(crate) fn apply_encoded(&mut self, payload: &[u8]) -> Result<(), String> {
        decode_changes(payload, self)
    }

    /// The memtable holding the last change of every key, as [`Memtable::apply_encoded`]
    /// of each record in turn would leave it. Each table's changes are sorted once (a
    /// stable sort, so the last change of a key stays last) and the map is built from the
    /// sorted run in one pass: reading a log back at open paid a search from the root,
    /// comparing keys at every level, for every change.
    pub(crate) fn build(mut self) -> Memtable {
        let mut mem = Memtable::default();
        macro_rules! build {
            ($t:ident) => {
                // `collect` sorts stably and keeps the last pair of equal keys.
                let map: BTreeMap<_, _> = std::mem::take(<$t as Table>::staged_mut(&mut self))
                    .into_iter()
                    .collect();
                for (k, v) in &map {
                    mem.bytes += key_bytes(k) + value_bytes(v);
                }
                mem.entries += map.len();
                *<$t as Table>::map_mut(&mut mem) = map;
            };
        }
        each_table!(build);
        mem
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ordered<K: TableKey>(k: &K) -> Vec<u8> {
        let mut out = Vec::new();
        k.to_ordered(&mut out);
        out
    }

    fn round_trip<K: TableKey>(k: &K) {
        let bytes = ordered(k);
        let mut r = Bytes::new(&bytes);
        assert_eq!(K::from_ordered(&mut r).as_ref(), Some(k), "{bytes:?}");
        assert!(r.is_empty(), "{k:?} left bytes behind");
    }

    #[test]
    fn ordered_keys_sort_as_bytes_exactly_as_the_keys_sort() {
        let strings = [
            "",
            "\0",
            "\0\0",
            "a",
            "a\0",
            "a\0b",
            "a\u{1}",
            "ab",
            "b",
            "é",
            "\u{ff}",
            // Longer than the 23 bytes a key keeps inline: stored apart, ordered the same.
            "abcdefghijklmnopqrstuvw",
            "abcdefghijklmnopqrstuvwx",
            "abcdefghijklmnopqrstuvwx\0",
        ];
        let numbers = [0u64, 1, 255, 256, 0xFF00_0000_0000_0000, u64::MAX];
        let mut pairs = Vec::new();
        let mut triples = Vec::new();
        let mut string_pairs = Vec::new();
        for s in strings {
            for n in numbers {
                pairs.push((SmolStr::new(s), n));
                for t in strings {
                    triples.push((SmolStr::new(s), n, SmolStr::new(t)));
                }
            }
            for t in strings {
                string_pairs.push((SmolStr::new(s), SmolStr::new(t)));
            }
        }
        fn check<K: TableKey>(keys: &[K]) {
            for a in keys {
                round_trip(a);
                for b in keys {
                    assert_eq!(a.cmp(b), ordered(a).cmp(&ordered(b)), "{a:?} vs {b:?}");
                }
            }
        }
        check(&strings.map(SmolStr::new));
        check(&numbers);
        check(&pairs);
        check(&triples);
        check(&string_pairs);
        let timers: Vec<(u8, u64, SmolStr)> = triples
            .iter()
            .map(|(s, n, _)| (u8::try_from(s.len() % 7).unwrap_or(0), *n, s.clone()))
            .collect();
        check(&timers);
        let seqs: Vec<(u64, u64)> = numbers
            .iter()
            .flat_map(|a| numbers.map(|b| (*a, b)))
            .collect();
        check(&seqs);
    }

    #[test]
    fn ordered_string_refuses_bytes_it_never_writes() {
        for bad in [&[b'a'][..], &[0, 1], &[0xC3, 0, 0], &[0]] {
            assert_eq!(SmolStr::from_ordered(&mut Bytes::new(bad)), None, "{bad:?}");
        }
    }

    /// Log records whose changes overlap: a key set, replaced, deleted and set again
    /// across records, in several tables, with keys out of order.
    fn overlapping_records() -> Vec<Vec<u8>> {
        let mut records = Vec::new();
        for round in 0..40u64 {
            let mut m = Memtable::default();
            for i in 0..25u64 {
                let id = SmolStr::from(format!("op-{}", (i * 7 + round * 3) % 31));
                let value = (round % 3 != 0).then(|| format!("{round}:{i}").into_bytes());
                m.set::<Receipts>(id.clone(), value);
                m.set::<Events>((i * 13 + round) % 50, Some(vec![round as u8; i as usize]));
                m.set::<OpEvents>((id.clone(), i % 4), (i % 5 != 0).then_some(()));
                m.set::<Timers>((2, (round + i) % 9, id), (round % 2 == 0).then_some(()));
            }
            records.push(m.encode());
        }
        // Records that change the same few keys one after another, as a log does (the state
        // record in every batch, one operation's receipt from submit to acknowledgement,
        // then deleted): staged, each replaces the change before it.
        for round in 0..30u64 {
            let mut m = Memtable::default();
            m.set::<Meta>("state".into(), Some(vec![round as u8; 4]));
            let receipt = (round % 4 != 3).then(|| vec![round as u8; 3]);
            m.set::<Receipts>("op-busy".into(), receipt);
            records.push(m.encode());
        }
        records
    }

    #[test]
    fn a_staged_log_builds_the_memtable_that_applying_each_record_in_turn_leaves() {
        let records = overlapping_records();
        let mut applied = Memtable::default();
        let mut staged = Staged::default();
        for r in &records {
            applied.apply_encoded(r).expect("a record this build wrote");
            staged.apply_encoded(r).expect("a record this build wrote");
        }
        assert_eq!(
            Meta::staged_mut(&mut staged).len(),
            1,
            "one state record staged"
        );
        let built = staged.build();
        assert!(
            applied.entries > 100,
            "the records overlap but are not tiny"
        );
        assert_eq!(built.encode(), applied.encode());
        assert_eq!(built.bytes(), applied.bytes());
        assert_eq!(built.entries, applied.entries);
        // A deletion is kept as one (a tombstone over the base), not dropped.
        assert!(built.receipts.values().any(Option::is_none));
    }

    #[test]
    fn a_staged_record_that_does_not_decode_is_refused_with_its_change_named() {
        let mut record = overlapping_records().swap_remove(0);
        record[4] = 99; // the first change's table
        let err = Staged::default()
            .apply_encoded(&record)
            .expect_err("no table 99");
        assert_eq!(err, "change 0 names table 99, which does not exist");
    }
}
