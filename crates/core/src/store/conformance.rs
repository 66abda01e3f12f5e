//! Checks that a checkpoint store keeps the contract of
//! [`SequenceStore`] and [`CheckpointStore`]: every store's tests run them
//! on a fresh pipeline (the folder store's in the core, the PostgreSQL
//! store's against a real server). Each check panics naming the guarantee
//! it found broken.

use super::contract::{Cas, CheckpointStore, Layout, Marks, Removal, Scope, SequenceStore};
use crate::membership::Epoch;
use crate::pipeline::Failover;
use crate::record::CheckpointId;

/// An entry name for checkpoint `id` (any bytes may be stored under it).
fn name(id: u64) -> String {
    format!("00c0ffee-1700000000{id:03}-{id}")
}

async fn fence(store: &dyn SequenceStore, expected: Epoch) -> Epoch {
    match store.fence(expected, "conformance").await.expect("fence") {
        Cas::Done(head) => {
            assert_eq!(head.epoch, expected.next(), "a fence raises the epoch by one");
            head.epoch
        }
        Cas::Moved(current) => panic!("fence at the current epoch {expected} was refused (store has {current})"),
    }
}

/// One sequence (`scope`) of `store`, which must hold nothing yet: fencing,
/// conditional writes, advances that never lower, removal and setting
/// aside, and what a fence makes visible.
pub async fn sequence_contract(store: &dyn CheckpointStore, scope: Scope) {
    let seq = store.sequence(scope);
    let head = seq.head().await.expect("head");
    assert_eq!(
        (head.id_watermark, head.committed_through),
        (None, None),
        "a fresh sequence has no marks"
    );
    assert!(
        seq.list().await.expect("list").is_empty(),
        "a fresh sequence has no entries"
    );
    let start = head.epoch;

    // Fencing is compare-and-set on the epoch.
    let e1 = fence(seq.as_ref(), start).await;
    assert_eq!(
        seq.fence(start, "late").await.expect("fence"),
        Cas::Moved(e1),
        "a fence decided on an old epoch takes nothing"
    );
    assert_eq!(seq.head().await.expect("head").owner.as_deref(), Some("conformance"));

    // Writes are conditional on the epoch.
    assert_eq!(
        seq.write(start, &name(1), b"old".to_vec()).await.expect("write"),
        Cas::Moved(e1),
        "a write under an older epoch is refused"
    );
    assert_eq!(seq.read(&name(1)).await.expect("read"), None, "and left nothing");
    assert_eq!(
        seq.write(e1, &name(1), b"one".to_vec()).await.expect("write"),
        Cas::Done(())
    );
    assert_eq!(
        seq.write(e1, &name(2), b"two".to_vec()).await.expect("write"),
        Cas::Done(())
    );
    assert_eq!(
        seq.write(e1, &name(2), b"two, again".to_vec()).await.expect("write"),
        Cas::Done(()),
        "writing a name again replaces it"
    );
    assert_eq!(seq.read(&name(1)).await.expect("read").as_deref(), Some(&b"one"[..]));
    assert_eq!(
        seq.read(&name(2)).await.expect("read").as_deref(),
        Some(&b"two, again"[..])
    );
    let listed: Vec<String> = seq
        .list()
        .await
        .expect("list")
        .into_iter()
        .map(|l| l.name.file_name)
        .collect();
    assert_eq!(listed, vec![name(1), name(2)], "listed oldest first");

    // Marks only rise, under the epoch.
    let marks = |w: u64, c: u64| Marks {
        id_watermark: Some(CheckpointId(w)),
        committed_through: Some(CheckpointId(c)),
    };
    let Cas::Done(head) = seq.advance(e1, marks(100, 2)).await.expect("advance") else {
        panic!("an advance under the current epoch was refused")
    };
    assert_eq!(
        (head.id_watermark, head.committed_through),
        (Some(CheckpointId(100)), Some(CheckpointId(2)))
    );
    let Cas::Done(head) = seq.advance(e1, marks(50, 1)).await.expect("advance") else {
        panic!("an advance under the current epoch was refused")
    };
    assert_eq!(
        (head.id_watermark, head.committed_through),
        (Some(CheckpointId(100)), Some(CheckpointId(2))),
        "marks are never lowered"
    );

    // A new owner fences: what the old one wrote stays visible, nothing of
    // the old epoch is accepted any more.
    let e2 = fence(seq.as_ref(), e1).await;
    let head = seq.head().await.expect("head");
    assert_eq!(
        (head.epoch, head.id_watermark, head.committed_through),
        (e2, Some(CheckpointId(100)), Some(CheckpointId(2))),
        "the new owner sees every accepted mark"
    );
    assert_eq!(
        seq.read(&name(2)).await.expect("read").as_deref(),
        Some(&b"two, again"[..]),
        "the new owner sees every accepted write"
    );
    assert_eq!(
        seq.write(e1, &name(3), b"zombie".to_vec()).await.expect("write"),
        Cas::Moved(e2)
    );
    assert_eq!(seq.read(&name(3)).await.expect("read"), None);
    assert_eq!(
        seq.advance(e1, marks(500, 5)).await.expect("advance"),
        Cas::Moved(e2),
        "a fenced owner cannot reserve ids"
    );
    assert_eq!(
        seq.remove(e1, &name(1), Removal::Delete).await.expect("remove"),
        Cas::Moved(e2),
        "a fenced owner cannot delete"
    );
    assert!(seq.read(&name(1)).await.expect("read").is_some());

    // Removal and setting aside.
    assert_eq!(
        seq.remove(e2, &name(1), Removal::Delete).await.expect("remove"),
        Cas::Done(())
    );
    assert_eq!(seq.read(&name(1)).await.expect("read"), None);
    assert_eq!(
        seq.remove(e2, &name(1), Removal::Delete).await.expect("remove"),
        Cas::Done(()),
        "removing what is gone is no error"
    );
    assert_eq!(
        seq.remove(e2, &name(2), Removal::SetAside).await.expect("remove"),
        Cas::Done(())
    );
    assert_eq!(seq.read(&name(2)).await.expect("read"), None, "set aside is no entry");
    let listed = seq.list().await.expect("list");
    assert_eq!(listed.len(), 1);
    assert!(listed[0].set_aside && listed[0].name.file_name == name(2), "{listed:?}");
}

/// Two handles of one store (two processes) racing: of two fences at the
/// same epoch exactly one wins, and after a fence returns every write of
/// the older epoch is either visible or refused, never accepted later.
pub async fn racing_handles(a: &dyn CheckpointStore, b: &dyn CheckpointStore, scope: Scope) {
    let (sa, sb) = (a.sequence(scope), b.sequence(scope));
    let start = sa.head().await.expect("head").epoch;
    let (ra, rb) = tokio::join!(sa.fence(start, "a"), sb.fence(start, "b"));
    let wins = [ra.expect("fence a"), rb.expect("fence b")]
        .iter()
        .filter(|r| matches!(r, Cas::Done(_)))
        .count();
    assert_eq!(wins, 1, "two fences at one epoch: exactly one takes the sequence");
    let mine = sa.head().await.expect("head").epoch;

    // `a` writes as fast as it can while `b` fences once.
    let writer = async {
        let mut accepted = Vec::new();
        for id in 100..400u64 {
            match sa.write(mine, &name(id), vec![b'x'; 64]).await.expect("write") {
                Cas::Done(()) => accepted.push(id),
                Cas::Moved(_) => return (accepted, Some(id)),
            }
        }
        (accepted, None)
    };
    let fencer = async {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        match sb.fence(mine, "b").await.expect("fence") {
            Cas::Done(head) => head.epoch,
            Cas::Moved(e) => panic!("b's fence at the current epoch was refused ({e})"),
        }
    };
    let ((accepted, refused_at), newer) = tokio::join!(writer, fencer);
    assert!(
        refused_at.is_some(),
        "the writer outran the fence: make the writes longer"
    );
    for id in &accepted {
        assert!(
            sb.read(&name(*id)).await.expect("read").is_some(),
            "write {id} was accepted under epoch {mine} but is not visible after epoch {newer} was taken"
        );
    }
    let after = sa.write(mine, &name(999), b"late".to_vec()).await.expect("write");
    assert_eq!(after, Cas::Moved(newer), "a write of the old epoch after the fence");
}

/// The pipeline-level calls: the layout is compare-and-set, retiring a
/// region sets its sequence aside and leaves a fresh one.
pub async fn pipeline_contract(store: &dyn CheckpointStore) {
    let two = Layout {
        failover: Failover::Region,
        parallelism: 2,
    };
    let one = Layout {
        failover: Failover::Global,
        parallelism: 1,
    };
    assert_eq!(store.layout().await.expect("layout"), None);
    assert_eq!(store.record_layout(None, two).await.expect("layout"), Cas::Done(()));
    assert_eq!(
        store.record_layout(None, one).await.expect("layout"),
        Cas::Moved(Some(two)),
        "a layout change decided on an old reading is refused"
    );
    assert_eq!(
        store.record_layout(Some(two), one).await.expect("layout"),
        Cas::Done(())
    );
    assert_eq!(store.layout().await.expect("layout"), Some(one));

    let region = store.sequence(Scope::Region(7));
    let epoch = fence(region.as_ref(), region.head().await.expect("head").epoch).await;
    assert_eq!(
        region.write(epoch, &name(1), b"r7".to_vec()).await.expect("write"),
        Cas::Done(())
    );
    let Cas::Done(_) = region
        .advance(
            epoch,
            Marks {
                id_watermark: Some(CheckpointId(100)),
                committed_through: None,
            },
        )
        .await
        .expect("advance")
    else {
        panic!("advance refused")
    };
    assert!(store.regions().await.expect("regions").contains(&7));
    store.retire(Scope::Region(7)).await.expect("retire");
    assert_eq!(
        region.write(epoch, &name(2), b"late".to_vec()).await.expect("write"),
        Cas::Moved(region.head().await.expect("head").epoch),
        "nothing of an epoch from before the retirement is accepted"
    );
    assert!(!store.regions().await.expect("regions").contains(&7));
    let fresh = store.sequence(Scope::Region(7));
    assert!(
        fresh.list().await.expect("list").is_empty(),
        "a retired region's entries are set aside"
    );
    assert_eq!(fresh.head().await.expect("head").id_watermark, None);
}
