//! The workers' leases in PostgreSQL ([`PgLeases`]) against a real server
//! from the test kit, case by case beside the rules of the pure model
//! ([`RegionLease`]): a claim fences the region's checkpoint sequence and
//! is refused while another worker's lease runs or after the epoch moved;
//! an expired lease goes to the next claimant and its old owner can neither
//! renew it nor write a checkpoint; renewals keep only what is still the
//! worker's; a release frees a region at once; and of many workers
//! claiming one region at the same moment, exactly one is granted.

use std::time::Duration;

use exactly_core::membership::{Claim, DbTime, Epoch, LeaseStore, RegionLease, View, WorkerId};
use exactly_core::{CheckpointStore, Checkpoints, Scope, StoreError};
use exactly_store_postgres::{PgCheckpointStore, PgLeases};
use exactly_testkit::PostgresServer;

mod common;
use common::{client, entry, unique};

const TERM: Duration = Duration::from_secs(60);

fn w(name: &str) -> WorkerId {
    WorkerId(name.into())
}

/// A fresh pipeline's store on `pg`.
fn store(pg: &PostgresServer, name: &str) -> PgCheckpointStore {
    PgCheckpointStore::new(pg.url(), &unique(name), 3).unwrap()
}

/// What the pure model decides for `who` claiming `region` as `view` shows
/// it (the store's outcome must be the same kind).
fn model_claim(view: &View, region: usize, who: &WorkerId, expected: Epoch, term: Duration) -> Claim {
    view.leases[region].claim(who, expected, view.now, term)
}

fn granted(claim: Claim) -> RegionLease {
    match claim {
        Claim::Granted(lease) => lease,
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// Polls until the store's clock is past `until`.
async fn until_past(leases: &PgLeases, until: DbTime) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while leases.view(0).await.unwrap().now <= until {
        assert!(tokio::time::Instant::now() < deadline, "the store's clock stands still");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_fences_the_sequence_and_a_held_lease_or_a_moved_epoch_is_refused() {
    let pg = PostgresServer::start().expect("PostgreSQL");
    let store = store(&pg, "claim");
    let leases = store.leases();
    let (a, b) = (w("a"), w("b"));
    let before = leases.view(2).await.unwrap();
    assert_eq!(
        before.leases,
        vec![RegionLease::default(); 2],
        "never claimed: free at epoch 0"
    );

    let claim = leases.claim(0, &a, Epoch(0), TERM).await.unwrap();
    assert!(matches!(model_claim(&before, 0, &a, Epoch(0), TERM), Claim::Granted(_)));
    let lease = granted(claim);
    assert_eq!((lease.owner.as_ref(), lease.epoch), (Some(&a), Epoch(1)));
    assert!(lease.expires >= before.now.after(TERM), "{lease:?} {before:?}");
    let now = leases.view(2).await.unwrap();
    assert_eq!(now.leases[0], lease, "the view shows the grant");

    // Held: refused to another worker, whatever epoch it read.
    for expected in [Epoch(1), Epoch(0)] {
        let claim = leases.claim(0, &b, expected, TERM).await.unwrap();
        assert_eq!(claim, model_claim(&now, 0, &b, expected, TERM));
        assert_eq!(
            claim,
            Claim::Held {
                by: a.clone(),
                until: lease.expires
            }
        );
    }
    // Decided on an old reading: nothing taken, not even by the holder.
    let claim = leases.claim(0, &a, Epoch(0), TERM).await.unwrap();
    assert_eq!(claim, Claim::EpochMoved { current: Epoch(1) });
    assert_eq!(claim, model_claim(&now, 0, &a, Epoch(0), TERM));

    // The grant fenced the region's sequence: its owner and epoch are the
    // claim's, and a write of the epoch before is refused.
    let sequence = store.sequence(Scope::Region(0));
    let head = sequence.head().await.unwrap();
    assert_eq!((head.epoch, head.owner.as_deref()), (Epoch(1), Some("a")));
    let checkpoints = Checkpoints::new(sequence, store.retain());
    let late = checkpoints.save(Epoch(0), &entry(store.pipeline(), 1)).await;
    assert!(matches!(late, Err(StoreError::Fenced { .. })), "{late:?}");
    checkpoints
        .save(Epoch(1), &entry(store.pipeline(), 1))
        .await
        .expect("the owner's epoch writes");
    let logged: i64 = client(pg.url())
        .await
        .query_one(
            "SELECT count(*) FROM exactly_epochs WHERE pipeline = $1 AND scope = 'region-0' AND epoch = 1 AND owner = 'a'",
            &[&store.pipeline()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(logged, 1, "the grant is in the epochs' audit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_goes_to_the_next_claimant_and_its_old_owner_renews_and_writes_nothing() {
    let pg = PostgresServer::start().expect("PostgreSQL");
    let store = store(&pg, "expiry");
    let leases = store.leases();
    let (a, b) = (w("a"), w("b"));
    let term = Duration::from_millis(300);
    let first = granted(leases.claim(1, &a, Epoch(0), term).await.unwrap());
    // Expiry is judged by the store's clock alone.
    until_past(&leases, first.expires).await;
    let view = leases.view(2).await.unwrap();
    assert!(view.leases[1].is_free(view.now), "{view:?}");
    let second = granted(leases.claim(1, &b, Epoch(1), TERM).await.unwrap());
    assert_eq!((second.owner, second.epoch), (Some(b.clone()), Epoch(2)));

    assert_eq!(
        leases.renew(&a, &[(1, Epoch(1))], true, TERM).await.unwrap(),
        vec![],
        "taken since: nothing to renew"
    );
    assert!(!leases.release(1, &a, Epoch(1)).await.unwrap(), "not a's to release");
    let checkpoints = Checkpoints::new(store.sequence(Scope::Region(1)), store.retain());
    let late = checkpoints.save(Epoch(1), &entry(store.pipeline(), 7)).await;
    assert!(matches!(late, Err(StoreError::Fenced { .. })), "{late:?}");
    // A lease that ran out but that nobody claimed is still its owner's to
    // renew (nobody else acted).
    let mine = granted(leases.claim(0, &a, Epoch(0), term).await.unwrap());
    until_past(&leases, mine.expires).await;
    assert_eq!(
        leases.renew(&a, &[(0, Epoch(1))], true, TERM).await.unwrap(),
        vec![(0, Epoch(1))]
    );
    let view = leases.view(2).await.unwrap();
    assert!(view.leases[0].is_held_by(&a, view.now), "{view:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_keep_what_is_still_the_workers_and_a_release_frees_a_region_at_once() {
    let pg = PostgresServer::start().expect("PostgreSQL");
    let store = store(&pg, "renew");
    let leases = store.leases();
    let (a, b) = (w("a"), w("b"));
    for region in 0..3 {
        granted(leases.claim(region, &a, Epoch(0), TERM).await.unwrap());
    }
    // The renewal comes later on the store's clock than the grants.
    let granted_at = leases.view(3).await.unwrap().now;
    until_past(&leases, granted_at).await;
    let before = leases.view(3).await.unwrap();
    let kept = leases
        .renew(&a, &[(0, Epoch(1)), (1, Epoch(1)), (2, Epoch(7))], true, TERM)
        .await
        .unwrap();
    assert_eq!(
        kept,
        vec![(0, Epoch(1)), (1, Epoch(1))],
        "not under an epoch it does not hold"
    );
    let after = leases.view(3).await.unwrap();
    for region in [0, 1] {
        assert!(
            after.leases[region].expires >= before.now.after(TERM)
                && after.leases[region].expires > before.leases[region].expires,
            "renewed for a term from the renewal: {after:?} {before:?}"
        );
    }
    assert_eq!(after.leases[2], before.leases[2], "untouched");
    assert_eq!(after.members.len(), 1, "{after:?}");
    assert_eq!(after.members[0].worker, a);
    assert!(after.members[0].is_live(after.now));

    assert!(leases.release(0, &a, Epoch(1)).await.unwrap());
    let released = leases.view(3).await.unwrap();
    assert!(released.leases[0].is_free(released.now), "free at once: {released:?}");
    assert_eq!(released.leases[0].epoch, Epoch(1), "the next claim raises it");
    let taken = granted(leases.claim(0, &b, Epoch(1), TERM).await.unwrap());
    assert_eq!(taken.epoch, Epoch(2));

    leases.leave(&a).await.unwrap();
    assert!(leases.view(3).await.unwrap().members.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_many_workers_claiming_one_region_at_once_exactly_one_is_granted() {
    let pg = PostgresServer::start().expect("PostgreSQL");
    let store = store(&pg, "race");
    // Each worker on its own connection, as separate processes would be.
    let workers: Vec<(WorkerId, PgLeases)> = (0..6).map(|i| (w(&format!("w{i}")), store.leases())).collect();
    // Connect (and make the region's row) first, so the claims race.
    for (_, leases) in &workers {
        leases.view(6).await.unwrap();
    }
    let claims =
        futures_util::future::join_all(workers.iter().map(|(who, leases)| leases.claim(5, who, Epoch(0), TERM))).await;
    let claims: Vec<Claim> = claims.into_iter().map(Result::unwrap).collect();
    let winners: Vec<&RegionLease> = claims
        .iter()
        .filter_map(|c| match c {
            Claim::Granted(lease) => Some(lease),
            _ => None,
        })
        .collect();
    assert_eq!(winners.len(), 1, "{claims:?}");
    let winner = winners[0].owner.clone().unwrap();
    for claim in &claims {
        match claim {
            Claim::Granted(lease) => assert_eq!(lease.epoch, Epoch(1)),
            Claim::Held { by, .. } => assert_eq!(by, &winner),
            Claim::EpochMoved { current } => assert_eq!(current.0, 1),
        }
    }
    let head = store.sequence(Scope::Region(5)).head().await.unwrap();
    assert_eq!((head.epoch, head.owner), (Epoch(1), Some(winner.0)));
}
