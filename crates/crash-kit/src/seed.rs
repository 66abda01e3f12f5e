//! The seed of the random kills: `EXACTLY_CRASH_SEED` when set (to rerun a
//! failure), else drawn fresh; printed whenever random kills run.

/// Environment variable fixing the seed of the random kills.
pub const SEED_ENV: &str = "EXACTLY_CRASH_SEED";

/// The seed from [`SEED_ENV`], or a fresh one.
pub(super) fn from_env_or_fresh() -> u64 {
    match std::env::var(SEED_ENV) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{SEED_ENV}={v:?} is not a number: set it to the seed a failure printed")),
        Err(_) => rand::random(),
    }
}
