//! [`PgLeases`]: the workers' membership and region leases of one pipeline
//! in the store's database ([`LeaseStore`]), judged by the database's clock.
//!
//! A region's lease is its row in `exactly_sequences` (`lease_holder`,
//! `lease_expires`, beside the `epoch` every checkpoint write is checked
//! against); membership rows are in `exactly_workers`. Every call is one
//! statement — its own transaction, at one `now()` — implementing the rule
//! of [`RegionLease`](exactly_core::membership::RegionLease) it names:
//!
//! - a claim is one `UPDATE` that raises the epoch and takes the lease
//!   only when the lease is free (never held, released, or
//!   `lease_expires < now()`) or the claimant's, and the epoch is the one
//!   it read; the grant is logged in `exactly_epochs` like every fence.
//!   Two claims of one region serialize on the row lock: under READ
//!   COMMITTED the second re-evaluates its condition on the row the first
//!   committed and finds the epoch moved (or the lease held). A refusal is
//!   then explained from the row read again (held by whom, until when, or
//!   the epoch now);
//! - a renewal extends, in one statement, the leases still the worker's
//!   under the epochs it names, and its membership row;
//! - a release frees the lease at once, the epoch unchanged.
//!
//! Times come back as milliseconds since the Unix epoch on the database's
//! clock ([`DbTime`]), rounded down.

use std::time::Duration;

use async_trait::async_trait;
use exactly_core::membership::{Claim, DbTime, Epoch, LeaseStore, Member, RegionLease, View, WorkerId};
use exactly_core::store::AccessError;

use crate::schema::REGION_PREFIX;
use crate::session::{Effect, Session};

/// The leases of one pipeline: one connection of their own, so a renewal
/// never waits behind a checkpoint write.
pub struct PgLeases {
    pub(crate) session: Session,
    pub(crate) pipeline: String,
}

impl std::fmt::Debug for PgLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLeases")
            .field("location", &self.session.location())
            .field("pipeline", &self.pipeline)
            .finish()
    }
}

const ENSURE: &str = "INSERT INTO exactly_sequences (pipeline, scope) SELECT $1, unnest($2::text[])
    ON CONFLICT (pipeline, scope) DO NOTHING";
/// Milliseconds since the Unix epoch of a `timestamptz`, rounded down.
macro_rules! ms {
    ($t:literal) => {
        concat!("floor(extract(epoch FROM ", $t, ") * 1000)::bigint")
    };
}
const VIEW: &str = concat!(
    "SELECT ",
    ms!("now()"),
    ",
        (SELECT coalesce(json_agg(json_build_array(worker, ",
    ms!("expires"),
    ")), '[]') FROM exactly_workers WHERE pipeline = $1)::text,
        (SELECT coalesce(json_agg(json_build_array(scope, epoch, lease_holder, ",
    ms!("lease_expires"),
    ")), '[]')
         FROM exactly_sequences WHERE pipeline = $1 AND scope LIKE 'region-%')::text"
);
/// $1 pipeline, $2 scope, $3 claimant, $4 expected epoch, $5 term in ms:
/// the grant, if any (the decision and the fence in one `UPDATE`, whose
/// row lock orders concurrent claims).
const CLAIM: &str = concat!(
    "WITH taken AS (
        UPDATE exactly_sequences SET epoch = epoch + 1, owner = $3, lease_holder = $3,
            lease_expires = now() + $5::bigint * interval '1 millisecond'
        WHERE pipeline = $1 AND scope = $2 AND epoch = $4
          AND (lease_holder IS NULL OR lease_holder = $3 OR lease_expires < now())
        RETURNING epoch, lease_expires),
    logged AS (
        INSERT INTO exactly_epochs (pipeline, scope, epoch, owner) SELECT $1, $2, epoch, $3 FROM taken)
    SELECT epoch, ",
    ms!("lease_expires"),
    " FROM taken"
);
/// $1 pipeline, $2 scope, $3 claimant: why a claim was refused — the row
/// as it is now, and whether another worker's lease runs.
const REFUSED: &str = concat!(
    "SELECT epoch, lease_holder, ",
    ms!("lease_expires"),
    ",
        coalesce(lease_holder IS NOT NULL AND lease_holder <> $3 AND lease_expires >= now(), false)
    FROM exactly_sequences WHERE pipeline = $1 AND scope = $2"
);
/// $1 pipeline, $2 worker, $3 scopes, $4 their epochs, $5 term in ms,
/// $6 renew the membership, $7 host, $8 pid.
const RENEW: &str = "WITH wanted AS (
        SELECT * FROM unnest($3::text[], $4::bigint[]) AS w(scope, epoch)),
    renewed AS (
        UPDATE exactly_sequences s SET lease_expires = now() + $5::bigint * interval '1 millisecond'
        FROM wanted w
        WHERE s.pipeline = $1 AND s.scope = w.scope AND s.epoch = w.epoch AND s.lease_holder = $2
        RETURNING s.scope, s.epoch),
    member AS (
        INSERT INTO exactly_workers (pipeline, worker, host, pid, started, expires)
        SELECT $1, $2, $7, $8, now(), now() + $5::bigint * interval '1 millisecond' WHERE $6
        ON CONFLICT (pipeline, worker) DO UPDATE SET expires = EXCLUDED.expires)
    SELECT scope, epoch FROM renewed";
const RELEASE: &str = "UPDATE exactly_sequences SET lease_holder = NULL, lease_expires = now()
    WHERE pipeline = $1 AND scope = $2 AND lease_holder = $3 AND epoch = $4
    RETURNING 1";
const LEAVE: &str = "DELETE FROM exactly_workers WHERE pipeline = $1 AND worker = $2";

/// How often a claim is tried again when the row that refused it would
/// grant it when read.
const CLAIM_TRIES: usize = 3;

fn scope(region: usize) -> String {
    format!("{REGION_PREFIX}{region}")
}

fn big(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn db_time(ms: Option<i64>) -> DbTime {
    DbTime(ms.map_or(0, |ms| ms.max(0) as u64))
}

fn term_ms(term: Duration) -> i64 {
    i64::try_from(term.as_millis()).unwrap_or(i64::MAX)
}

impl PgLeases {
    fn malformed(&self, what: &str, e: impl Into<exactly_core::BoxError>) -> AccessError {
        AccessError::determinate(self.session.location(), format!("reading {what}"), e)
    }

    /// Makes the rows of `regions`, so a claim finds one to lock.
    async fn ensure(&self, regions: &[usize]) -> Result<(), AccessError> {
        let scopes: Vec<String> = regions.iter().copied().map(scope).collect();
        self.session
            .query(
                "creating the regions' rows",
                Effect::Writes,
                ENSURE,
                &[&self.pipeline, &scopes],
            )
            .await
            .map(drop)
    }
}

#[async_trait]
impl LeaseStore for PgLeases {
    async fn view(&self, regions: usize) -> Result<View, AccessError> {
        let rows = self
            .session
            .query("reading the leases", Effect::Reads, VIEW, &[&self.pipeline])
            .await?;
        let row = rows.first().ok_or_else(|| self.malformed("the leases", "no row"))?;
        let now = db_time(row.get(0));
        let members: Vec<(String, Option<i64>)> =
            serde_json::from_str(row.get(1)).map_err(|e| self.malformed("the membership rows", e))?;
        let leases: Vec<(String, i64, Option<String>, Option<i64>)> =
            serde_json::from_str(row.get(2)).map_err(|e| self.malformed("the lease rows", e))?;
        let mut view = View {
            now,
            members: members
                .into_iter()
                .map(|(worker, expires)| Member {
                    worker: WorkerId(worker),
                    expires: db_time(expires),
                })
                .collect(),
            leases: vec![RegionLease::default(); regions],
        };
        view.members.sort_by(|a, b| a.worker.cmp(&b.worker));
        for (name, epoch, holder, expires) in leases {
            let Some(region) = name.strip_prefix(REGION_PREFIX).and_then(|r| r.parse::<usize>().ok()) else {
                continue;
            };
            if let Some(lease) = view.leases.get_mut(region) {
                *lease = RegionLease {
                    owner: holder.map(WorkerId),
                    epoch: Epoch(epoch.max(0) as u64),
                    expires: db_time(expires),
                };
            }
        }
        Ok(view)
    }

    async fn claim(
        &self,
        region: usize,
        who: &WorkerId,
        expected: Epoch,
        term: Duration,
    ) -> Result<Claim, AccessError> {
        self.ensure(&[region]).await?;
        let name = scope(region);
        // A refusal is explained by reading the row again; a row that would
        // grant the claim by then (released or expired in between) is
        // claimed again, a few times at most.
        for _ in 0..CLAIM_TRIES {
            let rows = self
                .session
                .query(
                    "claiming a region",
                    Effect::Writes,
                    CLAIM,
                    &[&self.pipeline, &name, &who.0, &big(expected.0), &term_ms(term)],
                )
                .await?;
            if let Some(row) = rows.first() {
                return Ok(Claim::Granted(RegionLease {
                    owner: Some(who.clone()),
                    epoch: Epoch(row.get::<_, i64>(0) as u64),
                    expires: db_time(row.get(1)),
                }));
            }
            let rows = self
                .session
                .query(
                    "reading a refused claim's region",
                    Effect::Reads,
                    REFUSED,
                    &[&self.pipeline, &name, &who.0],
                )
                .await?;
            let row = rows
                .first()
                .ok_or_else(|| self.malformed("the region's row", "no row"))?;
            let (epoch, holder, expires, held): (i64, Option<String>, Option<i64>, bool) =
                (row.get(0), row.get(1), row.get(2), row.get(3));
            let current = Epoch(epoch.max(0) as u64);
            match holder {
                Some(by) if held => {
                    return Ok(Claim::Held {
                        by: WorkerId(by),
                        until: db_time(expires),
                    })
                }
                _ if current != expected => return Ok(Claim::EpochMoved { current }),
                _ => {}
            }
        }
        Err(self.malformed(
            "a refused claim's region",
            format!("the lease of region {region} changed on each of {CLAIM_TRIES} tries"),
        ))
    }

    async fn renew(
        &self,
        who: &WorkerId,
        regions: &[(usize, Epoch)],
        member: bool,
        term: Duration,
    ) -> Result<Vec<(usize, Epoch)>, AccessError> {
        let scopes: Vec<String> = regions.iter().map(|(r, _)| scope(*r)).collect();
        let epochs: Vec<i64> = regions.iter().map(|(_, e)| big(e.0)).collect();
        let host = exactly_core::file_lock::host_name();
        let pid = std::process::id() as i32;
        let rows = self
            .session
            .query(
                "renewing the leases",
                Effect::Writes,
                RENEW,
                &[
                    &self.pipeline,
                    &who.0,
                    &scopes,
                    &epochs,
                    &term_ms(term),
                    &member,
                    &host,
                    &pid,
                ],
            )
            .await?;
        let mut kept: Vec<(usize, Epoch)> = rows
            .iter()
            .filter_map(|row| {
                let name: String = row.get(0);
                let region = name.strip_prefix(REGION_PREFIX)?.parse().ok()?;
                Some((region, Epoch(row.get::<_, i64>(1) as u64)))
            })
            .collect();
        kept.sort();
        Ok(kept)
    }

    async fn release(&self, region: usize, who: &WorkerId, epoch: Epoch) -> Result<bool, AccessError> {
        let rows = self
            .session
            .query(
                "releasing a region",
                Effect::Writes,
                RELEASE,
                &[&self.pipeline, &scope(region), &who.0, &big(epoch.0)],
            )
            .await?;
        Ok(!rows.is_empty())
    }

    async fn leave(&self, who: &WorkerId) -> Result<(), AccessError> {
        self.session
            .query("leaving the pipeline", Effect::Writes, LEAVE, &[&self.pipeline, &who.0])
            .await
            .map(drop)
    }

    /// Who holds the pipeline's lock (`PgCheckpointStore::lock`, taken by a
    /// run without workers), from `pg_locks`.
    async fn sole_holder(&self) -> Result<Option<String>, AccessError> {
        let (high, low) = crate::lock::halves(&crate::lock::key(&self.pipeline));
        let rows = self
            .session
            .query(
                "asking who holds the pipeline's lock",
                Effect::Reads,
                crate::lock::HOLDER,
                &[&high, &low],
            )
            .await?;
        Ok(rows.first().map(crate::lock::describe))
    }
}
