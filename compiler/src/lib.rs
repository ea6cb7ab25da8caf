//! coli's compiler: a RON architecture spec, a checkpoint's bindings and a device profile in;
//! a `Plan` (plain data) out. No GPU, no threads, no I/O beyond reading the files it is given.

pub mod bind;
pub mod ir;
