//! The leases of a fleet's outlets in PostgreSQL: the statements of docs/scale-out.md ("Outlets of a fleet") that
//! [`crate::store::lease::Leases`] decides to run, and the reads that feed the outlets a node holds, on a
//! connection of their own (never the turns' one, so that a renewal is never queued behind a turn, nor a turn
//! behind it). Every wait may be bounded ([`LeaseConn::within`]): the outbox must never be stuck in a wait past
//! the moment its leases run out.
//!
//! A renewal is one wait: the wanted outlets' rows made if they are not there (`ON CONFLICT DO NOTHING`), the
//! update that takes or keeps every lease that is free, expired or already this node's, writing what this node's
//! far sides acknowledged with `GREATEST` (a fact that only grows, right whoever writes it), and the select of
//! every wanted outlet's acknowledged position and its app's head, for the lag budgets and the outlets' lag. The lease's end is the database's `now()` plus
//! [`DATABASE_LEASE`]: only the database's clock decides who may take a lease.

use std::time::Duration;

use tokio_postgres::Statement;
use tokio_postgres::types::ToSql;

use super::{NET_TIMEOUT, PgReader, Target, writer_config_of};
use crate::store::lease::{DATABASE_LEASE, OutletKey, Renewal};
use crate::store::{Chunk, OutletStart, StoreError};

const MAKE_ROWS: &str = "INSERT INTO outlets (app, name) \
     SELECT a.id, u.name FROM unnest($1::text[], $2::text[]) AS u(app, name) JOIN apps a ON a.name = u.app \
     ON CONFLICT (app, name) DO NOTHING";

const RENEW: &str = "UPDATE outlets o SET holder = $1, \
     lease_until = now() + $5::bigint * interval '1 millisecond', acked = GREATEST(o.acked, u.acked) \
     FROM unnest($2::text[], $3::text[], $4::bigint[]) AS u(app, name, acked), apps a \
     WHERE a.name = u.app AND o.app = a.id AND o.name = u.name \
       AND (o.holder = $1 OR o.holder IS NULL OR o.lease_until < now()) \
     RETURNING u.app, o.name, o.acked";

const ALL_ACKED: &str = "SELECT a.name, o.name, o.acked, a.head FROM outlets o JOIN apps a ON a.id = o.app \
     WHERE a.name = ANY($1::text[])";

/// A clean stop gives its leases back, with what its far sides acknowledged, so another node takes them at its
/// next renewal rather than when they expire.
const RELEASE: &str = "UPDATE outlets o SET holder = NULL, lease_until = NULL, acked = GREATEST(o.acked, u.acked) \
     FROM unnest($2::text[], $3::text[], $4::bigint[]) AS u(app, name, acked), apps a \
     WHERE a.name = u.app AND o.app = a.id AND o.name = u.name AND o.holder = $1";

/// An outlet's start, kept by the first node that takes its lease; `$6` NULL means the app's head now. A link or
/// wire into a far flow a row already has (an outlet renamed, or put back after a rename) takes that row's start,
/// since its far node numbers the flow by it: a new start would number it a second way, and the far node would take
/// new records for ones it has and drop them.
const KEEP_START: &str = "INSERT INTO outlet_starts (app, name, kind, target, flow, start) \
     SELECT a.id, $2, $3, $4, $5, COALESCE((SELECT k.start FROM outlet_starts k \
         WHERE k.app = a.id AND k.flow = $5::text ORDER BY k.name LIMIT 1), $6::bigint, a.head) \
     FROM apps a WHERE a.name = $1 \
     ON CONFLICT (app, name) DO NOTHING";

const READ_START: &str = "SELECT s.kind, s.target, s.flow, s.start FROM outlet_starts s \
     JOIN apps a ON a.id = s.app WHERE a.name = $1 AND s.name = $2";

pub use crate::store::engine::Renewed;

/// A connection for leases and feeds, with its statements prepared.
pub struct LeaseConn {
    reader: PgReader,
    make_rows: Statement,
    renew: Statement,
    all_acked: Statement,
    release: Statement,
    keep_start: Statement,
    read_start: Statement,
    node_id: String,
    lease: Duration,
}

/// The outlets of a renewal or release as the statements' arrays: apps, names, acknowledged positions.
fn arrays(outlets: &[(OutletKey, u64)]) -> (Vec<String>, Vec<String>, Vec<i64>) {
    (
        outlets.iter().map(|(k, _)| k.app.clone()).collect(),
        outlets.iter().map(|(k, _)| k.name.clone()).collect(),
        outlets
            .iter()
            .map(|(_, a)| (*a).min(i64::MAX as u64) as i64)
            .collect(),
    )
}

impl LeaseConn {
    /// Connects to the fleet's database as node `node_id` (its tables must be there: a node's store made them).
    pub fn open(url: &str, password: Option<&str>, node_id: &str) -> Result<Self, StoreError> {
        Self::open_within(url, password, node_id, DATABASE_LEASE, NET_TIMEOUT)
    }

    /// As [`LeaseConn::open`], with leases granted for `lease` (tests shorten it).
    pub fn open_with_lease(
        url: &str,
        password: Option<&str>,
        node_id: &str,
        lease: Duration,
    ) -> Result<Self, StoreError> {
        Self::open_within(url, password, node_id, lease, NET_TIMEOUT)
    }

    /// As [`LeaseConn::open_with_lease`], giving up after `within` (connecting and preparing together).
    pub fn open_within(
        url: &str,
        password: Option<&str>,
        node_id: &str,
        lease: Duration,
        within: Duration,
    ) -> Result<Self, StoreError> {
        let mut config = writer_config_of(url, password, "pure-serve leases")?;
        config
            .connect_timeout(NET_TIMEOUT)
            .tcp_user_timeout(NET_TIMEOUT);
        let target = Target {
            config,
            shown: url.to_string(),
        };
        let reader = PgReader::connect(target, Some(tokio::time::Instant::now() + within), None)?;
        let p = |sql: &'static str| {
            reader.wait("preparing a lease statement", reader.client.prepare(sql))
        };
        let (make_rows, renew, all_acked) = (p(MAKE_ROWS)?, p(RENEW)?, p(ALL_ACKED)?);
        let (release, keep_start, read_start) = (p(RELEASE)?, p(KEEP_START)?, p(READ_START)?);
        reader.deadline.set(None);
        Ok(LeaseConn {
            reader,
            make_rows,
            renew,
            all_acked,
            release,
            keep_start,
            read_start,
            node_id: node_id.to_string(),
            lease,
        })
    }
}

impl crate::store::engine::OutboxConn for LeaseConn {
    /// Bounds every later wait to end within `within` from now (`None`: no bound but the network's).
    fn within(&self, within: Option<Duration>) {
        self.reader
            .deadline
            .set(within.map(|d| tokio::time::Instant::now() + d));
    }

    /// Runs `renewal` (one wait: its three statements pipelined).
    fn renew(&mut self, renewal: &Renewal) -> Result<Renewed, StoreError> {
        let (apps, names, acked) = arrays(&renewal.outlets);
        let lease_ms = self.lease.as_millis() as i64;
        let mut distinct = apps.clone();
        distinct.sort();
        distinct.dedup();
        let c = &self.reader.client;
        let make_args: [&(dyn ToSql + Sync); 2] = [&apps, &names];
        let renew_args: [&(dyn ToSql + Sync); 5] =
            [&self.node_id, &apps, &names, &acked, &lease_ms];
        let all_args: [&(dyn ToSql + Sync); 1] = [&distinct];
        let (_, held, all) = self.reader.wait("renewing the outlets' leases", async {
            tokio::try_join!(
                c.execute(&self.make_rows, &make_args),
                c.query(&self.renew, &renew_args),
                c.query(&self.all_acked, &all_args),
            )
        })?;
        let row = |r: &tokio_postgres::Row| {
            (
                OutletKey {
                    app: r.get(0),
                    name: r.get(1),
                },
                r.get::<_, i64>(2).max(0) as u64,
            )
        };
        let mut heads: Vec<(String, u64)> = all
            .iter()
            .map(|r| (r.get(0), r.get::<_, i64>(3).max(1) as u64))
            .collect();
        heads.sort();
        heads.dedup_by(|a, b| a.0 == b.0);
        Ok((
            held.iter().map(row).collect(),
            all.iter().map(row).collect(),
            heads,
        ))
    }

    /// Gives back the leases of `outlets` that this node holds, writing what their far sides acknowledged.
    fn release(&self, outlets: &[(OutletKey, u64)]) -> Result<(), StoreError> {
        let (apps, names, acked) = arrays(outlets);
        let args: [&(dyn ToSql + Sync); 4] = [&self.node_id, &apps, &names, &acked];
        self.reader.wait(
            "giving the outlets' leases back",
            self.reader.client.execute(&self.release, &args),
        )?;
        Ok(())
    }

    /// Where outlet `start.name` of `app` starts: the row already kept for it, or `start` kept now (its `start`
    /// field `0` meaning the app's head now, docs/apps.md `from = "next"`). The caller compares the kind and target.
    fn start_of(&self, app: &str, start: &OutletStart) -> Result<OutletStart, StoreError> {
        let given: Option<i64> = (start.start > 0).then_some(start.start as i64);
        let keep_args: [&(dyn ToSql + Sync); 6] = [
            &app,
            &start.name,
            &start.kind,
            &start.target,
            &start.flow,
            &given,
        ];
        let read_args: [&(dyn ToSql + Sync); 2] = [&app, &start.name];
        let c = &self.reader.client;
        let (_, row) = self.reader.wait("keeping an outlet's start", async {
            tokio::try_join!(
                c.execute(&self.keep_start, &keep_args),
                c.query_opt(&self.read_start, &read_args),
            )
        })?;
        let Some(row) = row else {
            return Err(StoreError::NoSuchDatabaseApp {
                app: app.to_string(),
                url: self.reader.shown.clone(),
                known: String::new(),
            });
        };
        Ok(OutletStart {
            name: start.name.clone(),
            kind: row.get(0),
            target: row.get(1),
            flow: row.get(2),
            start: row.get::<_, i64>(3).max(1) as u64,
        })
    }

    /// The heard sequence of source `source` in app `app` (0 if it has stored nothing there): where an inner
    /// outlet's destination holds its source.
    fn heard_of(&self, app: &str, source: &str) -> Result<u64, StoreError> {
        let c = &self.reader.client;
        let row = self.reader.wait(
            "reading a heard sequence",
            c.query_opt(
                "SELECT s.heard FROM sources s JOIN apps a ON a.id = s.app WHERE a.name = $1 AND s.name = $2",
                &[&app, &source],
            ),
        )?;
        Ok(row.map_or(0, |r| r.get::<_, i64>(0).max(0) as u64))
    }

    /// As [`PgReader::read_from`], for a held outlet's feed.
    fn read_from(
        &self,
        app: &str,
        from: u64,
        max_records: u64,
        max_bytes: usize,
    ) -> Result<Vec<Chunk>, StoreError> {
        self.reader.read_from(app, from, max_records, max_bytes)
    }
}
