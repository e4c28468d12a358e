//! The statements, once: their text, their parameter types, and the operations the
//! [`Store`](crate::index::store::Store) implementations run with them, on a pooled
//! connection (prepared once per connection and cached) or on a caller's transaction
//! (sent typed and unnamed: one round trip each, nothing left prepared on the caller's
//! connection).
//!
//! Only SQL that CockroachDB and YugabyteDB accept too: `ON CONFLICT`, `unnest` of arrays,
//! `FOR UPDATE [SKIP LOCKED]`; no advisory locks, no PL/pgSQL. Keys and values are
//! `bytea`, which compares as unsigned bytes (shorter first on a common prefix), exactly as
//! [`TableKey::to_ordered`](crate::index::TableKey::to_ordered) orders keys.

use std::collections::HashMap;
use std::ops::Bound;

use postgres::types::{ToSql, Type};
use postgres::{Row, Statement};

use crate::index::Memtable;

/// Changes per upsert or delete statement: a batch larger than this (a compaction's)
/// takes one statement per this many, so that no one message grows without bound.
const CHUNK_ROWS: usize = 10_000;

/// Key and value bytes per upsert or delete statement, as [`CHUNK_ROWS`].
const CHUNK_BYTES: usize = 16 << 20;

/// One end of a scanned range, as the statement's text writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Edge {
    /// `k >= $n` (low) or `k <= $n` (high).
    Included,
    /// `k > $n` or `k < $n`.
    Excluded,
    /// No condition.
    Unbounded,
}

impl Edge {
    /// The edge of `b`, and its key if it has one.
    fn of(b: Bound<&[u8]>) -> (Edge, Option<&[u8]>) {
        match b {
            Bound::Included(k) => (Edge::Included, Some(k)),
            Bound::Excluded(k) => (Edge::Excluded, Some(k)),
            Bound::Unbounded => (Edge::Unbounded, None),
        }
    }
}

/// A statement of the store: the cache key of its prepared form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Sql {
    /// The value of one key: `$1` journal, `$2` table, `$3` key.
    Get,
    /// The entries of one table.
    Count,
    /// Whether the journal holds any entry.
    Any,
    /// Entries of one table in a key range, in key order: `$1` journal, `$2` table, then
    /// the low key, the high key (each if bounded) and the limit.
    Scan(Edge, Edge),
    /// Inserts or replaces rows: `$1` journal, `$2` tables, `$3` keys, `$4` values.
    Upsert,
    /// Deletes rows: `$1` journal, `$2` tables, `$3` keys.
    Delete,
}

impl Sql {
    /// The statement's text.
    pub(super) fn text(self) -> String {
        match self {
            Sql::Get => {
                "SELECT v FROM opjournal_kv WHERE journal = $1 AND tbl = $2 AND k = $3".to_string()
            }
            Sql::Count => "SELECT count(*)::int8 FROM opjournal_kv WHERE journal = $1 AND tbl = $2"
                .to_string(),
            Sql::Any => "SELECT EXISTS (SELECT 1 FROM opjournal_kv WHERE journal = $1)".to_string(),
            Sql::Scan(lo, hi) => {
                let mut text =
                    String::from("SELECT k, v FROM opjournal_kv WHERE journal = $1 AND tbl = $2");
                let mut n = 2;
                for (edge, incl, excl) in [(lo, ">=", ">"), (hi, "<=", "<")] {
                    let op = match edge {
                        Edge::Included => incl,
                        Edge::Excluded => excl,
                        Edge::Unbounded => continue,
                    };
                    n += 1;
                    text.push_str(&format!(" AND k {op} ${n}"));
                }
                text.push_str(&format!(" ORDER BY k LIMIT ${}", n + 1));
                text
            }
            Sql::Upsert => "INSERT INTO opjournal_kv (journal, tbl, k, v) \
                 SELECT $1, t.tbl, t.k, t.v FROM unnest($2::int2[], $3::bytea[], $4::bytea[]) \
                 AS t (tbl, k, v) \
                 ON CONFLICT (journal, tbl, k) DO UPDATE SET v = excluded.v"
                .to_string(),
            Sql::Delete => "DELETE FROM opjournal_kv WHERE journal = $1 AND (tbl, k) IN \
                 (SELECT t.tbl, t.k FROM unnest($2::int2[], $3::bytea[]) AS t (tbl, k))"
                .to_string(),
        }
    }

    /// The types of its parameters, in order.
    pub(super) fn types(self) -> Vec<Type> {
        match self {
            Sql::Get => vec![Type::TEXT, Type::INT2, Type::BYTEA],
            Sql::Count => vec![Type::TEXT, Type::INT2],
            Sql::Any => vec![Type::TEXT],
            Sql::Scan(lo, hi) => {
                let mut types = vec![Type::TEXT, Type::INT2];
                for edge in [lo, hi] {
                    if edge != Edge::Unbounded {
                        types.push(Type::BYTEA);
                    }
                }
                types.push(Type::INT8);
                types
            }
            Sql::Upsert => vec![
                Type::TEXT,
                Type::INT2_ARRAY,
                Type::BYTEA_ARRAY,
                Type::BYTEA_ARRAY,
            ],
            Sql::Delete => vec![Type::TEXT, Type::INT2_ARRAY, Type::BYTEA_ARRAY],
        }
    }
}

/// Entries read, in key order: (ordered key, value).
pub(super) type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// Parameters of a statement, in order.
type Params<'p> = [&'p (dyn ToSql + Sync)];

/// Runs the store's statements: a pooled connection, or a caller's transaction.
pub(super) trait Exec {
    /// Runs `sql` and returns its rows.
    fn rows(&mut self, sql: Sql, params: &Params<'_>) -> Result<Vec<Row>, postgres::Error>;

    /// Runs `sql` and returns the number of rows it changed.
    fn run(&mut self, sql: Sql, params: &Params<'_>) -> Result<u64, postgres::Error>;
}

/// A pooled connection's prepared statements: each prepared on its first use (one round
/// trip more, once per connection), then bound and executed in one round trip.
#[derive(Default)]
pub(super) struct Prepared {
    statements: HashMap<Sql, Statement>,
}

impl Prepared {
    /// The prepared form of `sql` on `client`.
    fn get(
        &mut self,
        client: &mut postgres::Client,
        sql: Sql,
    ) -> Result<Statement, postgres::Error> {
        if let Some(s) = self.statements.get(&sql) {
            return Ok(s.clone());
        }
        let s = client.prepare_typed(&sql.text(), &sql.types())?;
        self.statements.insert(sql, s.clone());
        Ok(s)
    }

    /// Runs `sql` on `client` with `params`, and returns its rows.
    pub(super) fn rows(
        &mut self,
        client: &mut postgres::Client,
        sql: Sql,
        params: &Params<'_>,
    ) -> Result<Vec<Row>, postgres::Error> {
        let s = self.get(client, sql)?;
        client.query(&s, params)
    }

    /// Runs `sql` on `client` with `params`, and returns the rows it changed.
    ///
    /// A DELETE is never prepared: it joins the table with the batch's keys, and a
    /// prepared statement's generic plan, made once per connection while the table was
    /// small, scans every row of the journal for ever after (a hash join), under the
    /// writer lock. Unnamed, it is planned with its parameters each time (an index probe
    /// per key), in the same one round trip.
    pub(super) fn run(
        &mut self,
        client: &mut postgres::Client,
        sql: Sql,
        params: &Params<'_>,
    ) -> Result<u64, postgres::Error> {
        if sql == Sql::Delete {
            let typed: Vec<(&(dyn ToSql + Sync), Type)> =
                params.iter().copied().zip(sql.types()).collect();
            return client.execute_typed(&sql.text(), &typed);
        }
        let s = self.get(client, sql)?;
        client.execute(&s, params)
    }
}

/// A caller's transaction runs each statement typed and unnamed (Parse, Bind, Execute in
/// one round trip): nothing stays prepared on a connection this crate does not own.
impl Exec for postgres::Transaction<'_> {
    fn rows(&mut self, sql: Sql, params: &Params<'_>) -> Result<Vec<Row>, postgres::Error> {
        let typed: Vec<(&(dyn ToSql + Sync), Type)> =
            params.iter().copied().zip(sql.types()).collect();
        self.query_typed(&sql.text(), &typed)
    }

    fn run(&mut self, sql: Sql, params: &Params<'_>) -> Result<u64, postgres::Error> {
        let typed: Vec<(&(dyn ToSql + Sync), Type)> =
            params.iter().copied().zip(sql.types()).collect();
        self.execute_typed(&sql.text(), &typed)
    }
}

/// The value under `key` in `table` of `journal`.
pub(super) fn get(
    x: &mut impl Exec,
    journal: &str,
    table: u8,
    key: &[u8],
) -> Result<Option<Vec<u8>>, postgres::Error> {
    let tbl = i16::from(table);
    let rows = x.rows(Sql::Get, &[&journal, &tbl, &key])?;
    rows.first().map(|r| r.try_get::<_, Vec<u8>>(0)).transpose()
}

/// At most `limit` entries of `table` in `(lo, hi)`, in key order.
pub(super) fn scan(
    x: &mut impl Exec,
    journal: &str,
    table: u8,
    lo: Bound<&[u8]>,
    hi: Bound<&[u8]>,
    limit: usize,
) -> Result<Entries, postgres::Error> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let tbl = i16::from(table);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let (lo_edge, lo_key) = Edge::of(lo);
    let (hi_edge, hi_key) = Edge::of(hi);
    let mut params: Vec<&(dyn ToSql + Sync)> = vec![&journal, &tbl];
    if let Some(k) = &lo_key {
        params.push(k);
    }
    if let Some(k) = &hi_key {
        params.push(k);
    }
    params.push(&limit);
    x.rows(Sql::Scan(lo_edge, hi_edge), &params)?
        .iter()
        .map(|r| Ok((r.try_get::<_, Vec<u8>>(0)?, r.try_get::<_, Vec<u8>>(1)?)))
        .collect()
}

/// The number of entries in `table`.
pub(super) fn count(x: &mut impl Exec, journal: &str, table: u8) -> Result<u64, postgres::Error> {
    let tbl = i16::from(table);
    let rows = x.rows(Sql::Count, &[&journal, &tbl])?;
    let n = match rows.first() {
        Some(r) => r.try_get::<_, i64>(0)?,
        None => 0,
    };
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Whether `journal` holds any entry.
pub(super) fn any(x: &mut impl Exec, journal: &str) -> Result<bool, postgres::Error> {
    let rows = x.rows(Sql::Any, &[&journal])?;
    match rows.first() {
        Some(r) => r.try_get::<_, bool>(0),
        None => Ok(false),
    }
}

/// One statement's worth of changes: parallel arrays, as `unnest` takes them. The values
/// are copies: [`Memtable::each_raw`] lends each one for its call only.
#[derive(Default)]
struct Chunk {
    tables: Vec<i16>,
    keys: Vec<Vec<u8>>,
    values: Vec<Vec<u8>>,
    bytes: usize,
}

impl Chunk {
    /// Whether the chunk holds a statement's worth ([`CHUNK_ROWS`] or [`CHUNK_BYTES`]).
    fn full(&self) -> bool {
        self.tables.len() >= CHUNK_ROWS || self.bytes >= CHUNK_BYTES
    }
}

/// Writes `changes` into `journal`: every put as an upsert, every deletion as a delete,
/// one statement per kind per [`CHUNK_ROWS`] changes (or [`CHUNK_BYTES`] bytes). A
/// memtable holds each key once, so no statement names a row twice (which `ON CONFLICT DO
/// UPDATE` refuses). Returns the number of statements run.
pub(super) fn apply(
    x: &mut impl Exec,
    journal: &str,
    changes: &Memtable,
) -> Result<usize, postgres::Error> {
    let mut puts = vec![Chunk::default()];
    let mut deletes = vec![Chunk::default()];
    changes.each_raw(|table, key, value| {
        let chunks = if value.is_some() {
            &mut puts
        } else {
            &mut deletes
        };
        if chunks.last().is_some_and(Chunk::full) {
            chunks.push(Chunk::default());
        }
        if let Some(c) = chunks.last_mut() {
            c.bytes += key.len() + value.map_or(0, <[u8]>::len);
            c.tables.push(i16::from(table));
            c.keys.push(key);
            if let Some(v) = value {
                c.values.push(v.to_vec());
            }
        }
    });
    let mut statements = 0;
    for c in deletes.iter().filter(|c| !c.tables.is_empty()) {
        x.run(Sql::Delete, &[&journal, &c.tables, &c.keys])?;
        statements += 1;
    }
    for c in puts.iter().filter(|c| !c.tables.is_empty()) {
        x.run(Sql::Upsert, &[&journal, &c.tables, &c.keys, &c.values])?;
        statements += 1;
    }
    Ok(statements)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scan_variant_numbers_its_parameters_as_its_types_list_them() {
        let edges = [Edge::Included, Edge::Excluded, Edge::Unbounded];
        for lo in edges {
            for hi in edges {
                let sql = Sql::Scan(lo, hi);
                let text = sql.text();
                let n = sql.types().len();
                assert!(text.ends_with(&format!("LIMIT ${n}")), "{text}");
                assert!(!text.contains(&format!("${}", n + 1)), "{text}");
            }
        }
        assert_eq!(
            Sql::Scan(Edge::Excluded, Edge::Included).text(),
            "SELECT k, v FROM opjournal_kv WHERE journal = $1 AND tbl = $2 AND k > $3 \
             AND k <= $4 ORDER BY k LIMIT $5"
        );
    }
}
