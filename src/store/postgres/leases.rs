//! The leases of a fleet's outlets in PostgreSQL: the statements of docs/scale-out.md ("Outlets of a fleet") that
//! [`crate::store::lease::Leases`] decides to run, on a connection of their own (never the turns' one, so that a
//! renewal is never queued behind a turn, nor a turn behind it).
//!
//! A renewal is one wait: the wanted outlets' rows made if they are not there (`ON CONFLICT DO NOTHING`), the
//! update that takes or keeps every lease that is free, expired or already this node's, writing what this node's
//! far sides acknowledged with `GREATEST` (a fact that only grows, right whoever writes it), and the select of
//! every wanted outlet's acknowledged position for the lag budgets. The lease's end is the database's `now()` plus
//! [`DATABASE_LEASE`]: only the database's clock decides who may take a lease.

use std::time::Duration;

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Statement};

use super::{NET_TIMEOUT, Target, config_of, db_err};
use crate::store::StoreError;
use crate::store::lease::{DATABASE_LEASE, OutletKey, Renewal};

const MAKE_ROWS: &str = "INSERT INTO outlets (app, name) \
     SELECT a.id, u.name FROM unnest($1::text[], $2::text[]) AS u(app, name) JOIN apps a ON a.name = u.app \
     ON CONFLICT (app, name) DO NOTHING";

const RENEW: &str = "UPDATE outlets o SET holder = $1, \
     lease_until = now() + $5::bigint * interval '1 millisecond', acked = GREATEST(o.acked, u.acked) \
     FROM unnest($2::text[], $3::text[], $4::bigint[]) AS u(app, name, acked), apps a \
     WHERE a.name = u.app AND o.app = a.id AND o.name = u.name \
       AND (o.holder = $1 OR o.holder IS NULL OR o.lease_until < now()) \
     RETURNING u.app, o.name, o.acked";

const ALL_ACKED: &str = "SELECT a.name, o.name, o.acked FROM outlets o JOIN apps a ON a.id = o.app \
     WHERE a.name = ANY($1::text[])";

/// What a renewal found: the leases this node holds (with their acknowledged positions), and every wanted outlet's
/// acknowledged position.
pub type Renewed = (Vec<(OutletKey, u64)>, Vec<(OutletKey, u64)>);

/// A connection for leases, with its statements prepared.
pub struct LeaseConn {
    rt: tokio::runtime::Runtime,
    client: Client,
    make_rows: Statement,
    renew: Statement,
    all_acked: Statement,
    node_id: String,
    lease: Duration,
    target: Target,
}

impl LeaseConn {
    /// Connects to the fleet's database as node `node_id` (its tables must be there: a node's store made them).
    pub fn open(url: &str, password: Option<&str>, node_id: &str) -> Result<Self, StoreError> {
        Self::open_with_lease(url, password, node_id, DATABASE_LEASE)
    }

    /// As [`LeaseConn::open`], with leases granted for `lease` (tests shorten it).
    pub fn open_with_lease(
        url: &str,
        password: Option<&str>,
        node_id: &str,
        lease: Duration,
    ) -> Result<Self, StoreError> {
        let mut config = config_of(url, password, "pure-serve leases")?;
        config
            .connect_timeout(NET_TIMEOUT)
            .tcp_user_timeout(NET_TIMEOUT);
        let target = Target {
            config,
            shown: url.to_string(),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| StoreError::SyncThread { source })?;
        let err = |doing| db_err(&target, doing);
        let (client, make_rows, renew, all_acked) = rt.block_on(async {
            let (client, connection) = target
                .config
                .connect(NoTls)
                .await
                .map_err(err("connecting for leases"))?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            let p = |sql: &'static str| {
                let client = &client;
                let err = err("preparing a lease statement");
                async move { client.prepare(sql).await.map_err(err) }
            };
            let (m, r, a) = (p(MAKE_ROWS).await?, p(RENEW).await?, p(ALL_ACKED).await?);
            Ok::<_, StoreError>((client, m, r, a))
        })?;
        Ok(LeaseConn {
            rt,
            client,
            make_rows,
            renew,
            all_acked,
            node_id: node_id.to_string(),
            lease,
            target,
        })
    }

    /// Runs `renewal` (one wait: its three statements pipelined).
    pub fn renew(&mut self, renewal: &Renewal) -> Result<Renewed, StoreError> {
        let apps: Vec<String> = renewal.outlets.iter().map(|(k, _)| k.app.clone()).collect();
        let names: Vec<String> = renewal
            .outlets
            .iter()
            .map(|(k, _)| k.name.clone())
            .collect();
        let acked: Vec<i64> = renewal
            .outlets
            .iter()
            .map(|(_, a)| (*a).min(i64::MAX as u64) as i64)
            .collect();
        let lease_ms = self.lease.as_millis() as i64;
        let mut distinct = apps.clone();
        distinct.sort();
        distinct.dedup();
        let c = &self.client;
        let make_args: [&(dyn ToSql + Sync); 2] = [&apps, &names];
        let renew_args: [&(dyn ToSql + Sync); 5] =
            [&self.node_id, &apps, &names, &acked, &lease_ms];
        let all_args: [&(dyn ToSql + Sync); 1] = [&distinct];
        let (_, held, all) = self
            .rt
            .block_on(async {
                tokio::try_join!(
                    c.execute(&self.make_rows, &make_args),
                    c.query(&self.renew, &renew_args),
                    c.query(&self.all_acked, &all_args),
                )
            })
            .map_err(db_err(&self.target, "renewing the outlets' leases"))?;
        let row = |r: &tokio_postgres::Row| {
            (
                OutletKey {
                    app: r.get(0),
                    name: r.get(1),
                },
                r.get::<_, i64>(2).max(0) as u64,
            )
        };
        Ok((
            held.iter().map(row).collect(),
            all.iter().map(row).collect(),
        ))
    }
}
