//! The `coli` command line.

fn main() {}
