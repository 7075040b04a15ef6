//! Library side of the `tune` and `simulate` CLI commands: clap argument structs and `run`
//! functions, so the binary only dispatches. Owns argument parsing, text/CSV/SVG output; must
//! not touch the algorithms (in `tune` and `sim`).
