//! Global transaction identifiers (gids) for `PREPARE TRANSACTION`, made
//! with `exactly_core::TransactionNames` (the same names as ever).
//!
//! A gid is `exactly:<pipeline>:<table>:<subtask>:<checkpoint>`. In the pipeline
//! and table parts `%`, `:` and `~` are percent-escaped, so the parts cannot run
//! into each other and `exactly:<pipeline>:<table>:<subtask>:` is a prefix that
//! names exactly one subtask's transactions.
//!
//! PostgreSQL accepts gids of at most 199 bytes. When the longest possible gid
//! of a pipeline/table pair (largest subtask and checkpoint numbers) would be
//! longer, the pair is written as `<pipeline 60 bytes>:<table 60 bytes>~<hash>`,
//! where `<hash>` is 16 hex digits of SHA-256 over the full names: shortening
//! depends only on the pipeline and the table, so every gid of a subtask keeps
//! the same prefix.

use exactly_core::TransactionNames;

/// Longest gid PostgreSQL accepts, in bytes (`GIDSIZE` - 1).
pub const MAX_GID_BYTES: usize = 199;

/// The gids of one pipeline and table: exactly_core's transaction names
/// scoped by both, within [`MAX_GID_BYTES`] (the shortening described
/// above is theirs).
fn names(pipeline: &str, table: &str) -> TransactionNames {
    TransactionNames::new(&[pipeline, table], Some(MAX_GID_BYTES))
}

/// The prefix shared by every gid of one sink subtask.
pub fn gid_prefix(pipeline: &str, table: &str, subtask: usize) -> String {
    names(pipeline, table).subtask_prefix(subtask)
}

/// The prefix shared by the gids of every subtask of one pipeline and table:
/// the gid prefix of a subtask without the subtask number
/// (`exactly:<pipeline>:<table>:`, or the shortened form).
pub(crate) fn table_prefix(pipeline: &str, table: &str) -> String {
    names(pipeline, table).prefix().to_string()
}

/// The subtask number of a gid that starts with `table_prefix` (see
/// [`table_prefix`]), or `None` when the gid is not of that form.
pub(crate) fn subtask_of(gid: &str, table_prefix: &str) -> Option<usize> {
    let rest = gid.strip_prefix(table_prefix)?;
    let (subtask, checkpoint) = rest.split_once(':')?;
    checkpoint.parse::<u64>().ok()?;
    subtask.parse().ok()
}

/// The gid of the transaction of `checkpoint` for the subtask whose prefix is
/// `prefix`.
pub fn gid(prefix: &str, checkpoint: u64) -> String {
    format!("{prefix}{checkpoint}")
}

/// The checkpoint number at the end of a gid.
pub(crate) fn checkpoint_of(gid: &str) -> Option<u64> {
    gid.rsplit_once(':')?.1.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_are_kept_readable() {
        let prefix = gid_prefix("orders-etl", "public.orders", 3);
        assert_eq!(prefix, "exactly:orders-etl:public.orders:3:");
        assert_eq!(gid(&prefix, 42), "exactly:orders-etl:public.orders:3:42");
        assert_eq!(checkpoint_of(&gid(&prefix, 42)), Some(42));
    }

    #[test]
    fn separators_in_names_are_escaped_so_prefixes_never_collide() {
        let a = gid_prefix("a", "b:1", 0);
        let b = gid_prefix("a:b", "1", 0);
        assert_ne!(a, b);
        assert_eq!(a, "exactly:a:b%3A1:0:");
        assert!(!gid(&a, 5).starts_with(&gid_prefix("a", "b", 1)));
        assert_eq!(gid_prefix("100%~", "t", 0), "exactly:100%25%7E:t:0:");
    }

    #[test]
    fn long_names_are_shortened_deterministically_within_the_limit() {
        let pipeline = "p".repeat(150);
        let table = "ü".repeat(100); // multi-byte: cut on a character boundary
        let prefix = gid_prefix(&pipeline, &table, usize::MAX);
        let longest = gid(&prefix, u64::MAX);
        assert!(longest.len() <= MAX_GID_BYTES, "{} bytes", longest.len());
        assert_eq!(prefix, gid_prefix(&pipeline, &table, usize::MAX));
        assert!(prefix.starts_with(&format!("exactly:{}:", "p".repeat(60))));
        assert!(prefix.contains('~'));
        // A different table with the same first 60 bytes gets a different prefix.
        let other = gid_prefix(&pipeline, &format!("{table}x"), usize::MAX);
        assert_ne!(prefix, other);
        // Every subtask of the same pair is shortened the same way.
        let p0 = gid_prefix(&pipeline, &table, 0);
        assert_eq!(
            p0.trim_end_matches(":0:"),
            prefix.trim_end_matches(&format!(":{}:", usize::MAX))
        );
    }

    #[test]
    fn the_subtask_of_a_gid_is_read_back_from_the_table_prefix() {
        for (pipeline, table) in [("orders-etl", "public.orders"), (&*"p".repeat(150), "t")] {
            let base = table_prefix(pipeline, table);
            for subtask in [0, 7, usize::MAX] {
                let prefix = gid_prefix(pipeline, table, subtask);
                assert!(prefix.starts_with(&base), "{prefix} / {base}");
                assert_eq!(subtask_of(&gid(&prefix, 42), &base), Some(subtask));
            }
            assert_eq!(subtask_of(&format!("{base}3"), &base), None, "no checkpoint");
            assert_eq!(subtask_of(&format!("{base}x:1"), &base), None);
        }
        // Another table whose name starts like this one's is not taken for it.
        let base = table_prefix("p", "t");
        assert_eq!(subtask_of(&gid(&gid_prefix("p", "t2", 1), 5), &base), None);
    }

    /// Gids already prepared on servers must be recognized by later
    /// versions: the shortened form is pinned byte for byte (computed from
    /// the rule in the module docs, independently of the code).
    #[test]
    fn shortened_gids_keep_their_form() {
        assert_eq!(
            gid_prefix(&"p".repeat(150), &"ü".repeat(100), 7),
            format!("exactly:{}:{}~8bb3c0fb70affdfc:7:", "p".repeat(60), "ü".repeat(30))
        );
    }

    #[test]
    fn the_longest_unshortened_pair_fits() {
        // 8 + p + 1 + t + 1 + 20 + 1 + 20 = 199 → p + t = 148.
        let prefix = gid_prefix(&"p".repeat(74), &"t".repeat(74), usize::MAX);
        assert!(!prefix.contains('~'));
        assert_eq!(gid(&prefix, u64::MAX).len(), MAX_GID_BYTES);
        let shortened = gid_prefix(&"p".repeat(75), &"t".repeat(74), 0);
        assert!(shortened.contains('~'));
    }
}
