use proptest::prelude::*;

use super::*;
use crate::records::{committed_records, BatchRecord, DecodedBatch};

fn header(batch: &DecodedBatch) -> BatchHeader {
    BatchHeader {
        magic: 2,
        base_offset: batch.base_offset,
        last_offset: batch.last_offset,
        producer_id: batch.producer_id,
        producer_epoch: batch.producer_epoch,
        transactional: batch.transactional,
        control: batch.control.is_some(),
        leader_epoch: 0,
    }
}

/// The offsets a read_committed consumer gets from `batches` with the
/// broker's list `aborted`, starting at `from`.
fn delivered(batches: &[DecodedBatch], aborted: &[(i64, i64)], from: i64) -> Vec<i64> {
    let mut filter = AbortedFilter::new(aborted.iter().copied());
    let mut offsets = Vec::new();
    for batch in batches.iter().filter(|b| b.last_offset >= from) {
        let verdict = filter
            .judge(&header(batch), || {
                Ok::<_, ()>(batch.control.expect("asked for control batches only"))
            })
            .unwrap();
        if verdict == Verdict::Deliver {
            offsets.extend(batch.records.iter().map(|r| r.offset).filter(|o| *o >= from));
        }
    }
    offsets
}

/// One step of a generated log.
#[derive(Debug, Clone)]
enum Step {
    /// A plain batch of `n` records.
    Plain(usize),
    /// A transactional batch of `n` records of producer `p` (opening its
    /// transaction if none is open).
    Write(i64, usize),
    /// Producer `p` ends its open transaction (if any): commit or abort.
    End(i64, bool),
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        (1usize..4).prop_map(Step::Plain),
        (1i64..4, 1usize..4).prop_map(|(p, n)| Step::Write(p, n)),
        (1i64..4, any::<bool>()).prop_map(|(p, c)| Step::End(p, c)),
    ];
    prop::collection::vec(step, 1..40)
}

/// The log the steps write, every transaction ended at the end (so all of
/// it is below the last stable offset), and the broker's aborted
/// transactions as `(producer, first offset, marker offset)`.
fn log(steps: &[Step]) -> (Vec<DecodedBatch>, Vec<(i64, i64, i64)>) {
    let mut batches = Vec::new();
    let mut open: std::collections::BTreeMap<i64, i64> = Default::default();
    let mut aborted = Vec::new();
    let mut next = 0i64;
    let data = |next: &mut i64, producer: i64, transactional: bool, n: usize| {
        let records = (0..n as i64)
            .map(|i| BatchRecord {
                offset: *next + i,
                timestamp: 0,
                key: None,
                value: None,
                headers: Vec::new(),
            })
            .collect();
        let batch = DecodedBatch {
            base_offset: *next,
            last_offset: *next + n as i64 - 1,
            producer_id: producer,
            producer_epoch: if producer < 0 { -1 } else { 0 },
            transactional,
            control: None,
            records,
        };
        *next += n as i64;
        batch
    };
    let mut end = |next: &mut i64, open: &mut std::collections::BTreeMap<i64, i64>, p: i64, commit: bool| {
        let first = open.remove(&p)?;
        if !commit {
            aborted.push((p, first, *next));
        }
        let marker = DecodedBatch {
            base_offset: *next,
            last_offset: *next,
            producer_id: p,
            producer_epoch: 0,
            transactional: true,
            control: Some(if commit {
                ControlMarker::Commit
            } else {
                ControlMarker::Abort
            }),
            records: Vec::new(),
        };
        *next += 1;
        Some(marker)
    };
    for step in steps {
        match *step {
            Step::Plain(n) => batches.push(data(&mut next, -1, false, n)),
            Step::Write(p, n) => {
                open.entry(p).or_insert(next);
                batches.push(data(&mut next, p, true, n));
            }
            Step::End(p, commit) => batches.extend(end(&mut next, &mut open, p, commit)),
        }
    }
    let still_open: Vec<i64> = open.keys().copied().collect();
    for p in still_open {
        batches.extend(end(&mut next, &mut open, p, p % 2 == 0));
    }
    (batches, aborted)
}

proptest! {
    /// From any batch boundary of any log, with the aborted transactions a
    /// broker lists for a fetch from there, the filter delivers what the
    /// log-level committed reader (which needs no list) makes visible.
    #[test]
    fn agrees_with_the_log_level_reader(steps in steps(), start in any::<prop::sample::Index>()) {
        let (batches, aborted) = log(&steps);
        prop_assume!(!batches.is_empty(), "steps that end nothing write no batch");
        let from = batches[start.index(batches.len())].base_offset;
        // Kafka lists the aborted transactions whose range reaches the
        // fetch offset.
        let listed: Vec<(i64, i64)> = aborted
            .iter()
            .filter(|(_, _, marker)| *marker >= from)
            .map(|(p, first, _)| (*p, *first))
            .collect();
        let expected: Vec<i64> = committed_records("t", 0, batches.clone())
            .into_iter()
            .map(|r| r.offset)
            .filter(|o| *o >= from)
            .collect();
        prop_assert_eq!(delivered(&batches, &listed, from), expected);
    }
}

#[test]
fn an_aborted_transaction_is_dropped_and_the_producers_next_one_delivered() {
    let (batches, aborted) = log(&[
        Step::Write(1, 2),
        Step::Plain(1),
        Step::End(1, false),
        Step::Write(1, 2),
        Step::End(1, true),
    ]);
    let listed: Vec<(i64, i64)> = aborted.iter().map(|(p, f, _)| (*p, *f)).collect();
    assert_eq!(listed, [(1, 0)]);
    // 0-1 aborted, 2 plain, 3 marker, 4-5 committed, 6 marker.
    assert_eq!(delivered(&batches, &listed, 0), [2, 4, 5]);
    // Without the list the aborted records would get through: the list is
    // what decides.
    assert_eq!(delivered(&batches, &[], 0), [0, 1, 2, 4, 5]);
}

#[test]
fn markers_are_decoded_only_for_control_batches_of_producers() {
    let (batches, _) = log(&[Step::Plain(2), Step::Write(2, 1), Step::End(2, true)]);
    let mut filter = AbortedFilter::new([]);
    let mut asked = 0;
    for batch in &batches {
        filter
            .judge(&header(batch), || {
                asked += 1;
                Ok::<_, ()>(batch.control.unwrap())
            })
            .unwrap();
    }
    assert_eq!(asked, 1);
}

#[test]
fn an_emptied_marker_leaves_the_aborted_state_as_it_was() {
    let batch = |base: i64, control: bool| BatchHeader {
        magic: 2,
        base_offset: base,
        last_offset: base,
        producer_id: 5,
        producer_epoch: 0,
        transactional: true,
        control,
        leader_epoch: 0,
    };
    let mut filter = AbortedFilter::new([(5, 0)]);
    let judge = |filter: &mut AbortedFilter, header: BatchHeader, marker: ControlMarker| {
        filter.judge(&header, || Ok::<_, ()>(marker)).unwrap()
    };
    assert_eq!(judge(&mut filter, batch(0, false), ControlMarker::Abort), Verdict::Skip);
    assert_eq!(
        judge(&mut filter, batch(1, true), ControlMarker::Emptied),
        Verdict::Skip
    );
    assert_eq!(
        judge(&mut filter, batch(2, false), ControlMarker::Abort),
        Verdict::Skip,
        "still the aborted transaction"
    );
    assert_eq!(judge(&mut filter, batch(3, true), ControlMarker::Abort), Verdict::Skip);
    assert_eq!(
        judge(&mut filter, batch(4, false), ControlMarker::Abort),
        Verdict::Deliver
    );
}

#[test]
fn messages_of_formats_v0_and_v1_are_plain_among_aborted_transactions() {
    use crate::message_set::{plain, wrapper, Codec};
    let entries = [
        plain(0, 0, 0, "k", "v"),
        plain(1, 1, 0, "k", "v"),
        wrapper(
            4,
            1,
            Codec::Gzip,
            false,
            0,
            &[plain(0, 1, 0, "k", "v"), plain(2, 1, 0, "k", "v")].concat(),
        ),
    ];
    // The list names producer 5 from offset 0 and producer -1 (none) too.
    let mut filter = AbortedFilter::new([(5, 0), (-1, 0)]);
    for entry in entries {
        let header = BatchHeader::read(&entry).unwrap();
        assert_eq!(
            (header.producer_id, header.transactional, header.control),
            (-1, false, false)
        );
        let verdict = filter.judge(&header, || -> Result<ControlMarker, ()> {
            panic!("no marker in v0/v1")
        });
        assert_eq!(verdict, Ok(Verdict::Deliver));
    }
}
