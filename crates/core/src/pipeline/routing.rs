//! Which sink subtask a record goes to.

/// Stable 64-bit FNV-1a, so routing does not change between runs or versions.
fn stable_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The sink subtask that receives records of `split`.
pub fn route(split: &str, parallelism: usize) -> usize {
    (stable_hash(split) % parallelism as u64) as usize
}
