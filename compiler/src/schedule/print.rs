//! The text form of a schedule: per frame a header (`frame 1 on d0, replayable:`), then one
//! line per call, an op alone as the program's printer writes it and a fused kernel with
//! what it absorbed (`v9 = matmul rms_norm(v4 ...) blk.0.attn_q.weight[..] + v2`). Calls of
//! the epilogue end in `[tail]`. `coli compile --schedule` prints this; snapshots are made of it.
//!
//! Must not: change a schedule, only print one.

use super::{Call, Kernel, MatSrc, Norm, Residual, Rows, Schedule};
use crate::print::{g, op_text, w};
use std::fmt::Write;

/// The schedule as text.
pub fn print(schedule: &Schedule) -> String {
    let mut s = String::new();
    for f in &schedule.frames {
        let replay = if f.replayable { ", replayable" } else { "" };
        let _ = writeln!(s, "frame {} on {}{replay}: {} calls", f.frame.0, f.place, f.calls.len());
        for c in &f.calls {
            let _ = writeln!(s, "  {}", call_text(c));
        }
    }
    s
}

fn norm_text(n: &Norm) -> String {
    let offset = if n.offset != 0.0 { format!(" offset {}", g(n.offset)) } else { String::new() };
    format!("rms_norm({} {} eps {} group {}{offset})", n.x, w(&n.weight), g(n.eps), n.group)
}

fn residual_text(r: &Option<Residual>) -> String {
    r.map(|r| format!(" + {}", r.other)).unwrap_or_default()
}

/// One call as text.
pub fn call_text(c: &Call) -> String {
    let body = match &c.kernel {
        Kernel::Op(op) => op_text(op),
        Kernel::Linears { x, outs } => {
            let names: Vec<String> = outs.iter().map(|o| o.out.to_string()).collect();
            let mats: Vec<String> = outs
                .iter()
                .map(|o| {
                    format!("{}{}", w(&o.weight), o.bias.as_ref().map(|b| format!(" + {}", w(b))).unwrap_or_default())
                })
                .collect();
            format!("{} = linears {x} {}", names.join(", "), mats.join(", "))
        }
        Kernel::Matmul(m) => {
            let src = match &m.src {
                MatSrc::Plain => m.x.to_string(),
                MatSrc::Norm(n) => norm_text(n),
                MatSrc::Glu { gate, up, kind } => format!("{kind:?}({gate}, {up})"),
            };
            let bias = m.bias.as_ref().map(|b| format!(" + {}", w(b))).unwrap_or_default();
            format!("{} = matmul {src} {}{bias}{}", m.dest(), w(&m.weight), residual_text(&m.residual))
        }
        Kernel::NormPair(a, b) => format!("{}, {} = rms_norm_pair {}, {}", a.out, b.out, norm_text(a), norm_text(b)),
        Kernel::Attention(a) => {
            let mut s = format!("{} = attention {} {} {} kv {}", a.out, a.q, a.k, a.v, a.layer);
            if let Some(r) = &a.rope {
                let _ = write!(s, " rope {} {:?} theta {} scaling {:?}", r.rotary_dim, r.style, g(r.theta), r.scaling);
            }
            if let Some((q, k)) = &a.norms {
                let _ = write!(s, " norms {}, {}", norm_text(q), norm_text(k));
            }
            if let Some(r) = &a.spec.rel {
                let _ = write!(s, " rel {} {} d_rel {} extent {}", r.r, w(&r.proj), r.d_rel, r.extent);
            }
            if a.one_kernel {
                s.push_str(" one-kernel decode");
            }
            s
        }
        Kernel::Experts(e) => {
            let x = e.norm.as_ref().map_or(e.x.to_string(), norm_text);
            let routing = e.route.as_ref().map_or(e.routing.to_string(), |r| format!("[{}]", op_text(r)));
            format!(
                "{} = experts {} {x} routing {routing} ({} experts, ffn {}, {:?}){}",
                e.dest(),
                e.layer,
                e.experts,
                e.ffn,
                e.glu,
                residual_text(&e.residual)
            )
        }
    };
    match c.rows {
        Rows::All => body,
        Rows::Tail => format!("{body} [tail]"),
    }
}
