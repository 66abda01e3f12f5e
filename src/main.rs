//! The `exactly` command: run a pipeline from a TOML file or inspect its
//! checkpoints (see [`exactly::cli`]).

fn main() -> anyhow::Result<()> {
    exactly::cli::main()
}
