//! What `recover` must do, decided: commit every committable the restored
//! checkpoint lists, in order, and abort every transaction the subtask
//! owns (its own and its adopted subtasks') that the list does not name.

use std::collections::HashSet;
use std::hash::Hash;

/// The decision of [`plan_recovery`].
#[derive(Debug, PartialEq, Eq)]
pub struct RecoveryPlan<'a, C, K> {
    /// Every listed committable, in the checkpoint's order (oldest first).
    /// Commit each as `commit` does: "already committed" is success, gone
    /// without a trace is `DataLoss`.
    pub commit: Vec<&'a C>,
    /// Every owned transaction found in the store that the list does not
    /// name: leftovers of a crash, to abort (roll back, delete). Their
    /// records are replayed from the checkpoint's positions.
    pub abort: Vec<K>,
}

/// Decides recovery from `pending` (the committables the checkpoint lists
/// for this subtask and its adopted ones), `key` (the store's name of a
/// committable's transaction) and `owned` (the names of every transaction
/// the store holds open or pre-committed for the subtasks this one owns).
///
/// Executing the plan is idempotent when commit and abort are: a crash
/// half-way leads to the same plan minus what was done.
pub fn plan_recovery<'a, C, K: Eq + Hash>(
    pending: &'a [C],
    key: impl Fn(&C) -> K,
    owned: impl IntoIterator<Item = K>,
) -> RecoveryPlan<'a, C, K> {
    let listed: HashSet<K> = pending.iter().map(key).collect();
    RecoveryPlan {
        commit: pending.iter().collect(),
        abort: owned.into_iter().filter(|k| !listed.contains(k)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_what_is_listed_and_aborts_the_rest_it_owns() {
        let pending = ["t:0:3".to_string(), "t:0:4".to_string()];
        let owned = ["t:0:2", "t:0:3", "t:0:5", "t:2:4"].map(String::from);
        let plan = plan_recovery(&pending, |c| c.clone(), owned);
        assert_eq!(
            plan.commit,
            vec![&pending[0], &pending[1]],
            "listed ones, even those not found"
        );
        assert_eq!(plan.abort, ["t:0:2", "t:0:5", "t:2:4"].map(String::from).to_vec());
        let nothing: [String; 0] = [];
        let plan = plan_recovery(&nothing, |c| c.clone(), ["t:0:1".to_string()]);
        assert!(plan.commit.is_empty());
        assert_eq!(plan.abort, vec!["t:0:1".to_string()]);
    }
}
