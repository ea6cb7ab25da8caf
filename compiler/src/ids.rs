//! Typed ids of a plan, each printing as its text form: `d0` (a device of the profile), `f3`
//! (a frame), `l12.e7` (expert 7 of layer 12), `l3:5` (op 5 of layer 3), and `Place` (`host`
//! or a device). No string names past the parser: plans refer to things by these.
//!
//! This module must not hold behaviour beyond printing and ordering.

use crate::ir::LayerId;
use std::fmt;

macro_rules! id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub u32);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

id!(
    /// A device of the profile, by its index there (`d0` is the primary).
    DeviceId,
    "d"
);
id!(
    /// A frame of the plan, in execution order (`f3`).
    FrameId,
    "f"
);

/// One routed expert of one layer (`l12.e7`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExpertId {
    pub layer: LayerId,
    pub index: u32,
}

impl fmt::Display for ExpertId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.e{}", self.layer, self.index)
    }
}

/// Which list of the program an op is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Part {
    Prologue,
    Layer(LayerId),
    Epilogue,
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Part::Prologue => f.write_str("prologue"),
            Part::Layer(l) => write!(f, "{l}"),
            Part::Epilogue => f.write_str("epilogue"),
        }
    }
}

/// One op of the program: its part and its index there (`l3:5`, `epilogue:1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId {
    pub part: Part,
    pub index: u32,
}

impl fmt::Display for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.part, self.index)
    }
}

/// Where something runs or lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Place {
    Host,
    Device(DeviceId),
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Host => f.write_str("host"),
            Place::Device(d) => write!(f, "{d}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_print_as_the_text_format() {
        assert_eq!(FrameId(3).to_string(), "f3");
        assert_eq!(DeviceId(1).to_string(), "d1");
        assert_eq!(ExpertId { layer: LayerId(12), index: 7 }.to_string(), "l12.e7");
        assert_eq!(OpId { part: Part::Layer(LayerId(3)), index: 5 }.to_string(), "l3:5");
        assert_eq!(Place::Host.to_string(), "host");
    }
}
