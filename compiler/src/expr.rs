//! The spec's expression language: tiny and typed.
//!
//! `hidden / heads`, `1.0 / sqrt(head_dim)`, `i >= first_dense && (i + 1) % step == 0`,
//! `contains(mlp_only_layers, i)`, `at(head_counts, i)`, `if(tie, 1, 0)`, `[0, 3]`. Four types
//! (`Int`, `Float`, `Bool`, `IntList`); `Int` widens to `Float` where a `Float` is expected and
//! in mixed arithmetic; `/` of two `Int`s is floor division. Functions: `sqrt ln exp pow min
//! max float int contains len at least if`. Expressions are checked against the symbols' declared types when a spec
//! is loaded and evaluated when it is compiled. An expression nests at most
//! `limits::EXPR_DEPTH` deep (the parser, the checker and the evaluator descend recursively),
//! and a Float result that is not finite (`1.0 / 0`, `sqrt(-1.0)`) is an error where it is made.
//! This module must not know spec or model names.

use crate::diag::Span;
use crate::limits;
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
pub enum Type {
    Int,
    Float,
    Bool,
    IntList,
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Type::Int => "Int",
            Type::Float => "Float",
            Type::Bool => "Bool",
            Type::IntList => "IntList",
        })
    }
}

impl Type {
    /// Whether a value of type `self` may stand where `want` is expected.
    pub fn fits(self, want: Type) -> bool {
        self == want || (self == Type::Int && want == Type::Float)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Int(i64),
    Float(f64),
    Bool(bool),
    IntList(Vec<i64>),
}

impl Value {
    pub fn ty(&self) -> Type {
        match self {
            Value::Int(_) => Type::Int,
            Value::Float(_) => Type::Float,
            Value::Bool(_) => Type::Bool,
            Value::IntList(_) => Type::IntList,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) => Some(*f),
            _ => None,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(i) => write!(f, "{i}"),
            Value::Float(x) => write!(f, "{x:?}"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::IntList(v) => write!(f, "{v:?}"),
        }
    }
}

/// An error in an expression, at a span of the file.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ExprError {
    pub span: Span,
    pub message: String,
}

fn err(span: Span, message: impl Into<String>) -> ExprError {
    ExprError { span, message: message.into() }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ExprKind {
    Lit(Value),
    Sym(String),
    Neg(Box<Expr>),
    Not(Box<Expr>),
    Bin(BinOp, Box<Expr>, Box<Expr>),
    Call(String, Vec<Expr>),
    /// `[a, b, ...]`: an IntList.
    List(Vec<Expr>),
}

/// A parsed expression; spans are offsets in the file the text came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
    /// Levels of the tree from here down (a leaf is 1); at most `limits::EXPR_DEPTH`.
    height: usize,
}

impl Expr {
    /// A node over its children, refused past `limits::EXPR_DEPTH` levels.
    fn node(kind: ExprKind, span: Span) -> Result<Expr, ExprError> {
        let below = match &kind {
            ExprKind::Lit(_) | ExprKind::Sym(_) => 0,
            ExprKind::Neg(x) | ExprKind::Not(x) => x.height,
            ExprKind::Bin(_, a, b) => a.height.max(b.height),
            ExprKind::Call(_, args) | ExprKind::List(args) => args.iter().map(|a| a.height).max().unwrap_or(0),
        };
        if below >= limits::EXPR_DEPTH.max {
            return Err(err(span, format!("the expression nests too deep ({})", limits::EXPR_DEPTH)));
        }
        Ok(Expr { kind, span, height: below + 1 })
    }
}

/// Parses `text`, which starts at byte `base` of its file.
pub fn parse(text: &str, base: usize) -> Result<Expr, ExprError> {
    let toks = lex(text, base)?;
    let mut p = P { toks, i: 0, end: base + text.len(), nest: 0 };
    let e = p.or()?;
    if let Some(t) = p.toks.get(p.i) {
        return Err(err(t.span, format!("unexpected `{}` after the expression", t.text)));
    }
    Ok(e)
}

#[derive(Clone, Debug)]
struct Tok {
    text: String,
    span: Span,
}

fn lex(text: &str, base: usize) -> Result<Vec<Tok>, ExprError> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let start = i;
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit)) {
            while i < b.len()
                && (b[i].is_ascii_alphanumeric()
                    || b[i] == b'.'
                    || b[i] == b'_'
                    || ((b[i] == b'-' || b[i] == b'+') && matches!(b[i - 1], b'e' | b'E')))
            {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == b'_' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
        } else {
            let two = text.get(i..i + 2).unwrap_or("");
            if ["==", "!=", "<=", ">=", "&&", "||"].contains(&two) {
                i += 2;
            } else if "+-*/%()<>!,[]".contains(c as char) {
                i += 1;
            } else {
                let ch = text[i..].chars().next().unwrap_or('?');
                return Err(err(
                    Span::new(base + i, base + i + ch.len_utf8()),
                    format!("unexpected character `{ch}` in an expression"),
                ));
            }
        }
        out.push(Tok { text: text[start..i].to_string(), span: Span::new(base + start, base + i) });
    }
    Ok(out)
}

struct P {
    toks: Vec<Tok>,
    i: usize,
    end: usize,
    /// Sub-expressions open around the one being parsed.
    nest: usize,
}

impl P {
    fn peek(&self) -> Option<&str> {
        self.toks.get(self.i).map(|t| t.text.as_str())
    }
    fn next(&mut self) -> Result<Tok, ExprError> {
        let t = self
            .toks
            .get(self.i)
            .cloned()
            .ok_or_else(|| err(Span::new(self.end, self.end), "the expression ends too early"))?;
        self.i += 1;
        Ok(t)
    }
    fn expect(&mut self, s: &str) -> Result<Tok, ExprError> {
        let t = self.next()?;
        if t.text != s {
            return Err(err(t.span, format!("expected `{s}`, found `{}`", t.text)));
        }
        Ok(t)
    }
    fn bin(&mut self, ops: &[(&str, BinOp)], sub: fn(&mut P) -> Result<Expr, ExprError>) -> Result<Expr, ExprError> {
        let mut l = sub(self)?;
        while let Some(&(_, op)) = ops.iter().find(|(s, _)| Some(*s) == self.peek()) {
            self.i += 1;
            let r = sub(self)?;
            let span = Span::new(l.span.start, r.span.end);
            l = Expr::node(ExprKind::Bin(op, Box::new(l), Box::new(r)), span)?;
        }
        Ok(l)
    }
    /// Enters one more level of nesting, refused past `limits::EXPR_DEPTH`.
    fn enter(&mut self) -> Result<(), ExprError> {
        if self.nest >= limits::EXPR_DEPTH.max {
            let span = self.toks.get(self.i).map(|t| t.span).unwrap_or(Span::new(self.end, self.end));
            return Err(err(span, format!("the expression nests too deep here ({})", limits::EXPR_DEPTH)));
        }
        self.nest += 1;
        Ok(())
    }
    fn or(&mut self) -> Result<Expr, ExprError> {
        self.enter()?;
        let r = self.bin(&[("||", BinOp::Or)], P::and);
        self.nest -= 1;
        r
    }
    fn and(&mut self) -> Result<Expr, ExprError> {
        self.bin(&[("&&", BinOp::And)], P::cmp)
    }
    fn cmp(&mut self) -> Result<Expr, ExprError> {
        use BinOp::*;
        self.bin(&[("==", Eq), ("!=", Ne), ("<=", Le), (">=", Ge), ("<", Lt), (">", Gt)], P::add)
    }
    fn add(&mut self) -> Result<Expr, ExprError> {
        self.bin(&[("+", BinOp::Add), ("-", BinOp::Sub)], P::mul)
    }
    fn mul(&mut self) -> Result<Expr, ExprError> {
        self.bin(&[("*", BinOp::Mul), ("/", BinOp::Div), ("%", BinOp::Rem)], P::unary)
    }
    fn unary(&mut self) -> Result<Expr, ExprError> {
        match self.peek() {
            Some("-") | Some("!") => {
                let t = self.next()?;
                self.enter()?;
                let x = self.unary();
                self.nest -= 1;
                let x = x?;
                let span = Span::new(t.span.start, x.span.end);
                let kind = if t.text == "-" { ExprKind::Neg(Box::new(x)) } else { ExprKind::Not(Box::new(x)) };
                Expr::node(kind, span)
            }
            _ => self.primary(),
        }
    }
    fn primary(&mut self) -> Result<Expr, ExprError> {
        let t = self.next()?;
        let c = t.text.as_bytes()[0];
        if t.text == "(" {
            let e = self.or()?;
            let close = self.expect(")")?;
            return Ok(Expr { span: Span::new(t.span.start, close.span.end), ..e });
        }
        if t.text == "[" {
            let mut items = Vec::new();
            if self.peek() != Some("]") {
                loop {
                    items.push(self.or()?);
                    if self.peek() == Some(",") {
                        self.i += 1;
                    } else {
                        break;
                    }
                }
            }
            let close = self.expect("]")?;
            return Expr::node(ExprKind::List(items), Span::new(t.span.start, close.span.end));
        }
        if c.is_ascii_digit() || c == b'.' {
            let s: String = t.text.chars().filter(|&c| c != '_').collect();
            let v = if s.contains(['.', 'e', 'E']) {
                let f: f64 = s.parse().map_err(|_| err(t.span, format!("`{}` is not a number", t.text)))?;
                if !f.is_finite() {
                    return Err(err(t.span, format!("`{}` is not a finite number", t.text)));
                }
                Value::Float(f)
            } else {
                Value::Int(s.parse().map_err(|_| err(t.span, format!("`{}` is not an integer", t.text)))?)
            };
            return Expr::node(ExprKind::Lit(v), t.span);
        }
        if c.is_ascii_alphabetic() || c == b'_' {
            match t.text.as_str() {
                "true" => return Expr::node(ExprKind::Lit(Value::Bool(true)), t.span),
                "false" => return Expr::node(ExprKind::Lit(Value::Bool(false)), t.span),
                _ => {}
            }
            if self.peek() == Some("(") {
                self.i += 1;
                let mut args = Vec::new();
                if self.peek() != Some(")") {
                    loop {
                        args.push(self.or()?);
                        if self.peek() == Some(",") {
                            self.i += 1;
                        } else {
                            break;
                        }
                    }
                }
                let close = self.expect(")")?;
                return Expr::node(ExprKind::Call(t.text, args), Span::new(t.span.start, close.span.end));
            }
            return Expr::node(ExprKind::Sym(t.text), t.span);
        }
        Err(err(t.span, format!("expected a number, a name or `(`, found `{}`", t.text)))
    }
}

/// Functions with their argument count.
const FUNCTIONS: &[(&str, usize)] = &[
    ("sqrt", 1),
    ("ln", 1),
    ("exp", 1),
    ("pow", 2),
    ("min", 2),
    ("max", 2),
    ("float", 1),
    ("int", 1),
    ("contains", 2),
    ("len", 1),
    ("at", 2),
    ("least", 1),
    ("if", 3),
];

impl Expr {
    /// Every symbol the expression reads.
    pub fn symbols(&self) -> Vec<(&str, Span)> {
        let mut out = Vec::new();
        self.walk(&mut |e| {
            if let ExprKind::Sym(s) = &e.kind {
                out.push((s.as_str(), e.span));
            }
        });
        out
    }

    fn walk<'a>(&'a self, f: &mut dyn FnMut(&'a Expr)) {
        f(self);
        match &self.kind {
            ExprKind::Lit(_) | ExprKind::Sym(_) => {}
            ExprKind::Neg(x) | ExprKind::Not(x) => x.walk(f),
            ExprKind::Bin(_, a, b) => {
                a.walk(f);
                b.walk(f);
            }
            ExprKind::Call(_, args) | ExprKind::List(args) => args.iter().for_each(|a| a.walk(f)),
        }
    }

    /// The type of the expression, given the types of the symbols.
    pub fn check(&self, types: &dyn Fn(&str) -> Option<Type>) -> Result<Type, ExprError> {
        let num = |t: Type, e: &Expr| -> Result<Type, ExprError> {
            if t == Type::Int || t == Type::Float {
                Ok(t)
            } else {
                Err(err(e.span, format!("expected a number, found a {t}")))
            }
        };
        match &self.kind {
            ExprKind::Lit(v) => Ok(v.ty()),
            ExprKind::List(items) => {
                for x in items {
                    let t = x.check(types)?;
                    if t != Type::Int {
                        return Err(err(x.span, format!("a list holds Ints, found a {t}")));
                    }
                }
                Ok(Type::IntList)
            }
            ExprKind::Sym(s) => types(s).ok_or_else(|| err(self.span, format!("unknown symbol `{s}`"))),
            ExprKind::Neg(x) => num(x.check(types)?, x),
            ExprKind::Not(x) => match x.check(types)? {
                Type::Bool => Ok(Type::Bool),
                t => Err(err(x.span, format!("`!` expects a Bool, found a {t}"))),
            },
            ExprKind::Bin(op, a, b) => {
                let (ta, tb) = (a.check(types)?, b.check(types)?);
                use BinOp::*;
                match op {
                    And | Or => {
                        for (t, e) in [(ta, a), (tb, b)] {
                            if t != Type::Bool {
                                return Err(err(e.span, format!("`&&` and `||` expect Bools, found a {t}")));
                            }
                        }
                        Ok(Type::Bool)
                    }
                    Eq | Ne if ta == Type::Bool && tb == Type::Bool => Ok(Type::Bool),
                    Eq | Ne | Lt | Le | Gt | Ge => {
                        num(ta, a)?;
                        num(tb, b)?;
                        Ok(Type::Bool)
                    }
                    Add | Sub | Mul | Div | Rem => {
                        let (ta, tb) = (num(ta, a)?, num(tb, b)?);
                        Ok(if ta == Type::Int && tb == Type::Int { Type::Int } else { Type::Float })
                    }
                }
            }
            ExprKind::Call(name, args) => {
                let Some(&(_, n)) = FUNCTIONS.iter().find(|(f, _)| f == name) else {
                    let known = FUNCTIONS.iter().map(|(f, _)| *f).collect::<Vec<_>>().join(" ");
                    return Err(err(self.span, format!("unknown function `{name}` (known: {known})")));
                };
                if args.len() != n {
                    return Err(err(self.span, format!("`{name}` takes {n} argument(s), found {}", args.len())));
                }
                let ts = args.iter().map(|a| a.check(types)).collect::<Result<Vec<_>, _>>()?;
                match name.as_str() {
                    "sqrt" | "ln" | "exp" | "pow" | "float" => {
                        for (t, a) in ts.iter().zip(args) {
                            num(*t, a)?;
                        }
                        Ok(Type::Float)
                    }
                    "int" => num(ts[0], &args[0]).map(|_| Type::Int),
                    "min" | "max" => {
                        let (a, b) = (num(ts[0], &args[0])?, num(ts[1], &args[1])?);
                        Ok(if a == Type::Int && b == Type::Int { Type::Int } else { Type::Float })
                    }
                    "contains" | "len" | "at" | "least" => {
                        if ts[0] != Type::IntList {
                            return Err(err(
                                args[0].span,
                                format!("`{name}` expects an IntList first, found a {}", ts[0]),
                            ));
                        }
                        if name == "len" || name == "least" {
                            return Ok(Type::Int);
                        }
                        if ts[1] != Type::Int {
                            return Err(err(
                                args[1].span,
                                format!("`{name}` expects an Int second, found a {}", ts[1]),
                            ));
                        }
                        Ok(if name == "at" { Type::Int } else { Type::Bool })
                    }
                    _ => {
                        // if(cond, a, b)
                        if ts[0] != Type::Bool {
                            return Err(err(args[0].span, format!("`if` expects a Bool condition, found a {}", ts[0])));
                        }
                        if ts[1] == ts[2] {
                            Ok(ts[1])
                        } else if ts[1].fits(Type::Float) && ts[2].fits(Type::Float) {
                            Ok(Type::Float)
                        } else {
                            Err(err(self.span, format!("`if` branches differ: {} and {}", ts[1], ts[2])))
                        }
                    }
                }
            }
        }
    }

    /// The value of the expression, given the values of the symbols. A Float that is not
    /// finite is an error at the (sub-)expression that made it.
    pub fn eval(&self, values: &dyn Fn(&str) -> Option<Value>) -> Result<Value, ExprError> {
        match self.eval_here(values)? {
            Value::Float(x) if !x.is_finite() => {
                Err(err(self.span, format!("this expression is {x}, not a finite number")))
            }
            v => Ok(v),
        }
    }

    fn eval_here(&self, values: &dyn Fn(&str) -> Option<Value>) -> Result<Value, ExprError> {
        let f = |e: &Expr| -> Result<f64, ExprError> {
            e.eval(values)?.as_f64().ok_or_else(|| err(e.span, "expected a number"))
        };
        match &self.kind {
            ExprKind::Lit(v) => Ok(v.clone()),
            ExprKind::List(items) => {
                let mut out = Vec::with_capacity(items.len());
                for x in items {
                    match x.eval(values)? {
                        Value::Int(i) => out.push(i),
                        _ => return Err(err(x.span, "expected an Int")),
                    }
                }
                Ok(Value::IntList(out))
            }
            ExprKind::Sym(s) => values(s).ok_or_else(|| err(self.span, format!("symbol `{s}` has no value"))),
            ExprKind::Neg(x) => match x.eval(values)? {
                Value::Int(i) => Ok(Value::Int(i.checked_neg().ok_or_else(|| err(self.span, "integer overflow"))?)),
                v => Ok(Value::Float(-v.as_f64().ok_or_else(|| err(x.span, "expected a number"))?)),
            },
            ExprKind::Not(x) => match x.eval(values)? {
                Value::Bool(b) => Ok(Value::Bool(!b)),
                _ => Err(err(x.span, "expected a Bool")),
            },
            ExprKind::Bin(op, a, b) => {
                use BinOp::*;
                if matches!(op, And | Or) {
                    let av = matches!(a.eval(values)?, Value::Bool(true));
                    // Short-circuit: `b` is not evaluated when `a` decides.
                    if (*op == And && !av) || (*op == Or && av) {
                        return Ok(Value::Bool(av));
                    }
                    return Ok(Value::Bool(matches!(b.eval(values)?, Value::Bool(true))));
                }
                let (va, vb) = (a.eval(values)?, b.eval(values)?);
                if let (Value::Bool(x), Value::Bool(y)) = (&va, &vb) {
                    return match op {
                        Eq => Ok(Value::Bool(x == y)),
                        Ne => Ok(Value::Bool(x != y)),
                        _ => Err(err(self.span, "expected numbers")),
                    };
                }
                if let (Value::Int(x), Value::Int(y)) = (&va, &vb) {
                    let (x, y) = (*x, *y);
                    return Ok(match op {
                        Add => Value::Int(x.checked_add(y).ok_or_else(|| err(self.span, "integer overflow"))?),
                        Sub => Value::Int(x.checked_sub(y).ok_or_else(|| err(self.span, "integer overflow"))?),
                        Mul => Value::Int(x.checked_mul(y).ok_or_else(|| err(self.span, "integer overflow"))?),
                        Div | Rem if y == 0 => return Err(err(b.span, "division by zero")),
                        Div => Value::Int(x.checked_div_euclid(y).ok_or_else(|| err(self.span, "integer overflow"))?),
                        Rem => Value::Int(x.checked_rem_euclid(y).ok_or_else(|| err(self.span, "integer overflow"))?),
                        Eq => Value::Bool(x == y),
                        Ne => Value::Bool(x != y),
                        Lt => Value::Bool(x < y),
                        Le => Value::Bool(x <= y),
                        Gt => Value::Bool(x > y),
                        Ge => Value::Bool(x >= y),
                        And | Or => unreachable!("handled above"),
                    });
                }
                let x = va.as_f64().ok_or_else(|| err(a.span, "expected a number"))?;
                let y = vb.as_f64().ok_or_else(|| err(b.span, "expected a number"))?;
                Ok(match op {
                    Add => Value::Float(x + y),
                    Sub => Value::Float(x - y),
                    Mul => Value::Float(x * y),
                    Div => Value::Float(x / y),
                    Rem => Value::Float(x % y),
                    Eq => Value::Bool(x == y),
                    Ne => Value::Bool(x != y),
                    Lt => Value::Bool(x < y),
                    Le => Value::Bool(x <= y),
                    Gt => Value::Bool(x > y),
                    Ge => Value::Bool(x >= y),
                    And | Or => unreachable!("handled above"),
                })
            }
            ExprKind::Call(name, args) => match name.as_str() {
                "sqrt" => Ok(Value::Float(f(&args[0])?.sqrt())),
                "ln" => Ok(Value::Float(f(&args[0])?.ln())),
                "exp" => Ok(Value::Float(f(&args[0])?.exp())),
                "pow" => Ok(Value::Float(f(&args[0])?.powf(f(&args[1])?))),
                "float" => Ok(Value::Float(f(&args[0])?)),
                "int" => {
                    let x = f(&args[0])?;
                    // Within ±2^63 (the cast would saturate silently past it).
                    if x.abs() >= 9.223_372_036_854_775e18 {
                        return Err(err(self.span, format!("int({x}) is too large for an Int")));
                    }
                    Ok(Value::Int(x as i64))
                }
                "min" | "max" => {
                    let (a, b) = (args[0].eval(values)?, args[1].eval(values)?);
                    let pick_a = match (&a, &b) {
                        (Value::Int(x), Value::Int(y)) => (x <= y) == (name == "min"),
                        _ => (f(&args[0])? <= f(&args[1])?) == (name == "min"),
                    };
                    let v = if pick_a { a } else { b };
                    if matches!((&args[0].eval(values)?, &args[1].eval(values)?), (Value::Int(_), Value::Int(_))) {
                        Ok(v)
                    } else {
                        Ok(Value::Float(v.as_f64().unwrap_or(0.0)))
                    }
                }
                "contains" | "len" | "at" | "least" => {
                    let Value::IntList(l) = args[0].eval(values)? else {
                        return Err(err(args[0].span, "expected an IntList"));
                    };
                    if name == "len" {
                        return Ok(Value::Int(l.len() as i64));
                    }
                    if name == "least" {
                        let least = l.iter().min().copied();
                        return least.map(Value::Int).ok_or_else(|| err(self.span, "least([]): the list is empty"));
                    }
                    let Value::Int(x) = args[1].eval(values)? else { return Err(err(args[1].span, "expected an Int")) };
                    if name == "contains" {
                        return Ok(Value::Bool(l.contains(&x)));
                    }
                    let item = usize::try_from(x).ok().and_then(|k| l.get(k)).copied();
                    item.map(Value::Int)
                        .ok_or_else(|| err(self.span, format!("at(list, {x}): the list has {} entries", l.len())))
                }
                "if" => match args[0].eval(values)? {
                    Value::Bool(true) => args[1].eval(values),
                    Value::Bool(false) => args[2].eval(values),
                    _ => Err(err(args[0].span, "expected a Bool")),
                },
                _ => Err(err(self.span, format!("unknown function `{name}`"))),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<Value> {
        match name {
            "hidden" => Some(Value::Int(576)),
            "heads" => Some(Value::Int(9)),
            "eps" => Some(Value::Float(1e-5)),
            "only" => Some(Value::IntList(vec![1, 3])),
            "i" => Some(Value::Int(3)),
            _ => None,
        }
    }
    fn types(name: &str) -> Option<Type> {
        env(name).map(|v| v.ty())
    }

    #[test]
    fn evaluates_with_types() {
        let e = parse("hidden / heads", 0).unwrap();
        assert_eq!(e.check(&types), Ok(Type::Int));
        assert_eq!(e.eval(&env), Ok(Value::Int(64)));
        let e = parse("1.0 / sqrt(hidden / heads)", 0).unwrap();
        assert_eq!(e.check(&types), Ok(Type::Float));
        assert_eq!(e.eval(&env), Ok(Value::Float(0.125)));
        let e = parse("!contains(only, i) && (i + 1) % 2 == 0", 0).unwrap();
        assert_eq!(e.check(&types), Ok(Type::Bool));
        assert_eq!(e.eval(&env), Ok(Value::Bool(false)));
        assert_eq!(parse("if(i > 2, 1, 2.5)", 0).unwrap().eval(&env), Ok(Value::Int(1)));
        let e = parse("contains([], i) || len([1, 2]) == 2", 0).unwrap();
        assert_eq!(e.check(&types), Ok(Type::Bool));
        assert_eq!(e.eval(&env), Ok(Value::Bool(true)));
    }

    #[test]
    fn list_entries_and_least() {
        let e = parse("at(only, 1) + least([4, 2, 7])", 0).unwrap();
        assert_eq!(e.check(&types), Ok(Type::Int));
        assert_eq!(e.eval(&env), Ok(Value::Int(5)));
        let e = parse("at(only, i)", 0).unwrap().eval(&env).unwrap_err();
        assert_eq!((e.span, e.message.as_str()), (Span::new(0, 11), "at(list, 3): the list has 2 entries"));
        assert!(parse("least([])", 0).unwrap().eval(&env).unwrap_err().message.contains("empty"));
        assert!(parse("at(i, 0)", 0).unwrap().check(&types).is_err());
        assert!(parse("at(only, 1.5)", 0).unwrap().check(&types).is_err());
    }

    #[test]
    fn results_that_are_not_finite_are_located_errors() {
        let e = parse("hidden + 1.0 / 0", 0).unwrap().eval(&env).unwrap_err();
        assert_eq!(e.span, Span::new(9, 16), "{e}");
        assert!(e.message.contains("is inf, not a finite number"), "{e}");
        let e = parse("2 * sqrt(0.0 - eps)", 0).unwrap().eval(&env).unwrap_err();
        assert_eq!(e.span, Span::new(4, 19), "{e}");
        assert!(e.message.contains("is NaN"), "{e}");
        assert!(parse("exp(1000.0)", 0).unwrap().eval(&env).is_err());
        assert!(parse("1e400", 0).unwrap_err().message.contains("not a finite number"));
        assert!(parse("int(1e30)", 0).unwrap().eval(&env).unwrap_err().message.contains("too large"));
    }

    #[test]
    fn integer_division_by_zero_and_overflow_are_errors() {
        let e = parse("hidden / (heads - 9)", 0).unwrap().eval(&env).unwrap_err();
        assert_eq!((e.span, e.message.as_str()), (Span::new(9, 20), "division by zero"));
        let e = parse("(0 - 9223372036854775807 - 1) / (0 - 1)", 0).unwrap().eval(&env).unwrap_err();
        assert_eq!(e.message, "integer overflow");
        assert!(parse("-(0 - 9223372036854775807 - 1)", 0).unwrap().eval(&env).is_err());
    }

    #[test]
    fn nesting_past_the_limit_is_an_error_not_a_stack_overflow() {
        let ok = format!("{}1{}", "(".repeat(200), ")".repeat(200));
        assert_eq!(parse(&ok, 0).unwrap().eval(&env), Ok(Value::Int(1)));
        let deep = format!("{}1{}", "(".repeat(5000), ")".repeat(5000));
        let e = parse(&deep, 0).unwrap_err();
        assert!(e.message.contains("nests too deep here (at most 256 levels"), "{e}");
        assert_eq!(e.span.start, 256);
        let e = parse(&"-".repeat(5000), 0).unwrap_err();
        assert!(e.message.contains("nests too deep"), "{e}");
        // A long chain is a deep tree: refused, not evaluated recursively.
        let chain = vec!["1"; 10_000].join(" + ");
        let e = parse(&chain, 0).unwrap_err();
        assert!(e.message.contains("nests too deep (at most 256"), "{e}");
        assert!(parse(&vec!["1"; 200].join(" + "), 0).is_ok());
    }

    #[test]
    fn reports_located_errors() {
        let e = parse("hidden / nope", 10).unwrap();
        let x = e.check(&types).unwrap_err();
        assert_eq!(x.span, Span::new(19, 23));
        assert!(x.message.contains("unknown symbol `nope`"));
        let x = parse("eps && true", 0).unwrap().check(&types).unwrap_err();
        assert!(x.message.contains("expect Bools"), "{x}");
        assert!(parse("1 +", 0).is_err());
        assert!(parse("a $ b", 0).unwrap_err().message.contains('$'));
    }
}
