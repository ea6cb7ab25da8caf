//! Turns a positioned `Node` tree into serde types, collecting every error it can with its
//! span instead of stopping at the first.
//!
//! How errors are collected: an error inside one element of a `[list]` or one entry of a
//! `{map}` is recorded and the element skipped, so the next elements are still read; an unknown
//! field is recorded and skipped; a bad field value is recorded and ends its struct (serde's
//! derived visitors cannot go on without it), and the struct's own follow-on errors are
//! suppressed. `Spanned<T>` asks this deserializer for the span of a value.
//! This module must not know any spec type.

use super::syntax::{Body, Node, NodeKind};
use crate::diag::Span;
use serde::de::{self, DeserializeSeed, IntoDeserializer, Visitor};
use std::cell::{Cell, RefCell};
use std::fmt;
use std::marker::PhantomData;

/// An error while reading a node, with the span it is about (the innermost known).
#[derive(Clone, Debug, PartialEq)]
pub struct DeError {
    pub span: Option<Span>,
    pub message: String,
    /// Already reported through the sink; carries failure upwards without a second message.
    pub suppressed: bool,
}

impl DeError {
    fn at(mut self, span: Span) -> DeError {
        if self.span.is_none() {
            self.span = Some(span);
        }
        self
    }
    fn suppressed() -> DeError {
        DeError { span: None, message: String::new(), suppressed: true }
    }
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        DeError { span: None, message: msg.to_string(), suppressed: false }
    }
}

/// Reads `T` from `node`; all errors found, each with a span. Alongside the errors, the value
/// read past them when there is one (bad list elements and map entries left out, unknown
/// fields ignored), so that later checks can still report on the rest.
pub fn from_node<'de, T: de::Deserialize<'de>>(node: &'de Node) -> (Option<T>, Vec<(Span, String)>) {
    let sink = RefCell::new(Vec::new());
    let r = T::deserialize(NodeDe { node, sink: &sink });
    let mut errors: Vec<(Span, String)> = sink.into_inner();
    match r {
        Ok(v) => (Some(v), errors),
        Err(e) => {
            if !e.suppressed {
                errors.push((e.span.unwrap_or(node.span), e.message));
            }
            (None, errors)
        }
    }
}

/// The struct name `Spanned<T>` asks for; answered with the value's span and the value.
pub const SPANNED: &str = "$coli::Spanned";
pub const SPANNED_FIELDS: &[&str] = &["$start", "$end", "$value"];

type Sink = RefCell<Vec<(Span, String)>>;

#[derive(Clone, Copy)]
struct NodeDe<'de, 's> {
    node: &'de Node,
    sink: &'s Sink,
}

impl<'de, 's> NodeDe<'de, 's> {
    fn record(&self, e: DeError, span: Span) {
        if !e.suppressed {
            self.sink.borrow_mut().push((e.span.unwrap_or(span), e.message));
        }
    }

    fn wrong(&self, expected: &str) -> DeError {
        DeError {
            span: Some(self.node.span),
            message: format!("expected {expected}, found {}", describe(self.node)),
            suppressed: false,
        }
    }
}

fn describe(n: &Node) -> String {
    match &n.kind {
        NodeKind::Int(i) => format!("the integer {i}"),
        NodeKind::Float(f) => format!("the number {f}"),
        NodeKind::Str(s) => format!("the string {s:?}"),
        NodeKind::Bool(b) => format!("`{b}`"),
        NodeKind::List(_) => "a list".into(),
        NodeKind::Map(_) => "a map".into(),
        NodeKind::Named { name: Some((name, _)), body: Body::Unit } => format!("`{name}`"),
        NodeKind::Named { name: Some((name, _)), .. } => format!("`{name}(...)`"),
        NodeKind::Named { name: None, body: Body::Fields(_) } => "a struct `(field: ...)`".into(),
        NodeKind::Named { name: None, .. } => "a tuple `(...)`".into(),
    }
}

macro_rules! ints {
    ($($m:ident => $v:ident : $t:ty),*) => {$(
        fn $m<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
            match self.node.kind {
                NodeKind::Int(i) => match <$t>::try_from(i) {
                    Ok(x) => visitor.$v(x).map_err(|e: DeError| e.at(self.node.span)),
                    Err(_) => Err(self.wrong(concat!("an integer that fits ", stringify!($t)))),
                },
                _ => Err(self.wrong("an integer")),
            }
        }
    )*};
}

impl<'de, 's> de::Deserializer<'de> for NodeDe<'de, 's> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let span = self.node.span;
        let r = match &self.node.kind {
            NodeKind::Int(i) => visitor.visit_i64(*i),
            NodeKind::Float(f) => visitor.visit_f64(*f),
            NodeKind::Str(s) => visitor.visit_borrowed_str(s),
            NodeKind::Bool(b) => visitor.visit_bool(*b),
            NodeKind::List(items) => visitor.visit_seq(Seq { items: items.iter(), sink: self.sink, tolerant: true }),
            NodeKind::Map(entries) => {
                visitor.visit_map(MapEntries { entries: entries.iter(), value: None, sink: self.sink })
            }
            NodeKind::Named { name, body } => match body {
                Body::Unit => match name.as_ref().map(|n| n.0.as_str()) {
                    Some("None") => visitor.visit_none(),
                    Some(n) => visitor.visit_borrowed_str(n),
                    None => visitor.visit_unit(),
                },
                Body::Tuple(items) => {
                    if name.as_ref().map(|n| n.0.as_str()) == Some("Some") && items.len() == 1 {
                        visitor.visit_some(NodeDe { node: &items[0], sink: self.sink })
                    } else {
                        visitor.visit_seq(Seq { items: items.iter(), sink: self.sink, tolerant: false })
                    }
                }
                Body::Fields(fields) => {
                    let failed = Cell::new(false);
                    let r = visitor.visit_map(Fields {
                        fields: fields.iter(),
                        known: None,
                        value: None,
                        sink: self.sink,
                        failed: &failed,
                    });
                    if failed.get() {
                        r.map_err(|_| DeError::suppressed())
                    } else {
                        r
                    }
                }
            },
        };
        r.map_err(|e: DeError| e.at(span))
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.node.kind {
            NodeKind::Bool(b) => visitor.visit_bool(b).map_err(|e: DeError| e.at(self.node.span)),
            _ => Err(self.wrong("`true` or `false`")),
        }
    }

    ints!(deserialize_i8 => visit_i8: i8, deserialize_i16 => visit_i16: i16, deserialize_i32 => visit_i32: i32,
          deserialize_i64 => visit_i64: i64, deserialize_u8 => visit_u8: u8, deserialize_u16 => visit_u16: u16,
          deserialize_u32 => visit_u32: u32, deserialize_u64 => visit_u64: u64);

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_f64(visitor)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.node.kind {
            NodeKind::Float(f) => visitor.visit_f64(f).map_err(|e: DeError| e.at(self.node.span)),
            NodeKind::Int(i) => visitor.visit_f64(i as f64).map_err(|e: DeError| e.at(self.node.span)),
            _ => Err(self.wrong("a number")),
        }
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match &self.node.kind {
            NodeKind::Str(s) => visitor.visit_borrowed_str(s).map_err(|e: DeError| e.at(self.node.span)),
            _ => Err(self.wrong("a string")),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, DeError> {
        Err(self.wrong("bytes (not supported)"))
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_bytes(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let r = match &self.node.kind {
            NodeKind::Named { name: Some((n, _)), body: Body::Unit } if n == "None" => visitor.visit_none(),
            NodeKind::Named { name: Some((n, _)), body: Body::Tuple(items) } if n == "Some" && items.len() == 1 => {
                visitor.visit_some(NodeDe { node: &items[0], sink: self.sink })
            }
            // A bare value stands for `Some(value)`.
            _ => visitor.visit_some(self),
        };
        r.map_err(|e: DeError| e.at(self.node.span))
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match &self.node.kind {
            NodeKind::Named { name: None, body: Body::Tuple(items) } if items.is_empty() => visitor.visit_unit(),
            _ => Err(self.wrong("`()`")),
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value, DeError> {
        match &self.node.kind {
            NodeKind::Named { name: Some((n, _)), body: Body::Unit } if n == name => visitor.visit_unit(),
            _ => self.deserialize_unit(visitor),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _name: &'static str, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_newtype_struct(self).map_err(|e: DeError| e.at(self.node.span))
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let r = match &self.node.kind {
            NodeKind::List(items) => visitor.visit_seq(Seq { items: items.iter(), sink: self.sink, tolerant: true }),
            NodeKind::Named { name: None, body: Body::Tuple(items) } => {
                visitor.visit_seq(Seq { items: items.iter(), sink: self.sink, tolerant: false })
            }
            _ => return Err(self.wrong("a list `[...]`")),
        };
        r.map_err(|e: DeError| e.at(self.node.span))
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, DeError> {
        let r = match &self.node.kind {
            NodeKind::List(items) | NodeKind::Named { body: Body::Tuple(items), .. } => {
                visitor.visit_seq(Seq { items: items.iter(), sink: self.sink, tolerant: false })
            }
            _ => return Err(self.wrong("a tuple `(...)`")),
        };
        r.map_err(|e: DeError| e.at(self.node.span))
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_tuple(len, visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match &self.node.kind {
            NodeKind::Map(entries) => visitor
                .visit_map(MapEntries { entries: entries.iter(), value: None, sink: self.sink })
                .map_err(|e: DeError| e.at(self.node.span)),
            _ => Err(self.wrong("a map `{...}`")),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        known: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        if name == SPANNED {
            return visitor.visit_map(SpannedAccess { de: self, step: 0 });
        }
        let span = self.node.span;
        let fields: &'de [(String, Span, Node)] = match &self.node.kind {
            NodeKind::Named { name: n, body: Body::Fields(f) } => {
                if let Some((n, nspan)) = n {
                    if n != name {
                        return Err(DeError {
                            span: Some(*nspan),
                            message: format!("expected `{name}(...)`, found `{n}`"),
                            suppressed: false,
                        });
                    }
                }
                f
            }
            NodeKind::Named { name: n, body: Body::Unit | Body::Tuple(_) }
                if matches!(&self.node.kind, NodeKind::Named { body: Body::Unit, .. })
                    || matches!(&self.node.kind, NodeKind::Named { body: Body::Tuple(t), .. } if t.is_empty()) =>
            {
                if let Some((n, nspan)) = n {
                    if n != name {
                        return Err(DeError {
                            span: Some(*nspan),
                            message: format!("expected `{name}(...)`, found `{n}`"),
                            suppressed: false,
                        });
                    }
                }
                &[]
            }
            _ => return Err(self.wrong(&format!("a struct `{name}(field: ...)`"))),
        };
        let failed = Cell::new(false);
        let r = visitor.visit_map(Fields {
            fields: fields.iter(),
            known: Some(known),
            value: None,
            sink: self.sink,
            failed: &failed,
        });
        match r {
            Err(_) if failed.get() => Err(DeError::suppressed()),
            r => r.map_err(|e: DeError| e.at(span)),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        match &self.node.kind {
            NodeKind::Named { name: Some((n, nspan)), body } => visitor
                .visit_enum(Enum { variant: n, variant_span: *nspan, body, node: self.node, sink: self.sink })
                .map_err(|e: DeError| e.at(self.node.span)),
            _ => Err(self.wrong("a variant name")),
        }
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let r = match &self.node.kind {
            NodeKind::Str(s) => visitor.visit_borrowed_str(s),
            NodeKind::Named { name: Some((n, _)), body: Body::Unit } => visitor.visit_borrowed_str(n),
            _ => return Err(self.wrong("a name")),
        };
        r.map_err(|e: DeError| e.at(self.node.span))
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_unit()
    }
}

struct Seq<'de, 's> {
    items: std::slice::Iter<'de, Node>,
    sink: &'s Sink,
    /// Record a bad element and report it suppressed (lists); tuples pass errors up as they are.
    tolerant: bool,
}

impl<'de, 's> de::SeqAccess<'de> for Seq<'de, 's> {
    type Error = DeError;
    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, DeError> {
        let Some(node) = self.items.next() else { return Ok(None) };
        let de = NodeDe { node, sink: self.sink };
        match seed.deserialize(de) {
            Ok(v) => Ok(Some(v)),
            // The element is recorded and skipped; `Items` reads on, a plain `Vec` stops.
            Err(e) if self.tolerant => {
                de.record(e, node.span);
                Err(DeError::suppressed())
            }
            Err(e) => Err(e.at(node.span)),
        }
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len())
    }
}

struct MapEntries<'de, 's> {
    entries: std::slice::Iter<'de, (Node, Node)>,
    value: Option<&'de Node>,
    sink: &'s Sink,
}

impl<'de, 's> de::MapAccess<'de> for MapEntries<'de, 's> {
    type Error = DeError;
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, DeError> {
        let Some((k, v)) = self.entries.next() else { return Ok(None) };
        self.value = Some(v);
        let de = NodeDe { node: k, sink: self.sink };
        match seed.deserialize(de) {
            Ok(key) => Ok(Some(key)),
            Err(e) => {
                de.record(e, k.span);
                self.value = None;
                Err(DeError::suppressed())
            }
        }
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let v = self.value.take().ok_or_else(|| de::Error::custom("a map value without a key"))?;
        let de = NodeDe { node: v, sink: self.sink };
        match seed.deserialize(de) {
            Ok(x) => Ok(x),
            Err(e) => {
                de.record(e, v.span);
                Err(DeError::suppressed())
            }
        }
    }
}

struct Fields<'de, 's, 'f> {
    fields: std::slice::Iter<'de, (String, Span, Node)>,
    /// The field names the target type knows; others are reported and skipped.
    known: Option<&'static [&'static str]>,
    value: Option<&'de Node>,
    sink: &'s Sink,
    failed: &'f Cell<bool>,
}

impl<'de, 's, 'f> de::MapAccess<'de> for Fields<'de, 's, 'f> {
    type Error = DeError;
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, DeError> {
        loop {
            let Some((k, kspan, v)) = self.fields.next() else { return Ok(None) };
            if let Some(known) = self.known {
                if !known.contains(&k.as_str()) {
                    let list = known.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>().join(", ");
                    self.sink.borrow_mut().push((*kspan, format!("unknown field `{k}`, expected one of {list}")));
                    self.failed.set(true);
                    continue;
                }
            }
            self.value = Some(v);
            let key =
                seed.deserialize(de::value::BorrowedStrDeserializer::<DeError>::new(k)).map_err(|e| e.at(*kspan))?;
            return Ok(Some(key));
        }
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let v = self.value.take().ok_or_else(|| de::Error::custom("a field value without a name"))?;
        let de = NodeDe { node: v, sink: self.sink };
        match seed.deserialize(de) {
            Ok(x) => Ok(x),
            Err(e) => {
                de.record(e, v.span);
                self.failed.set(true);
                Err(DeError::suppressed())
            }
        }
    }
}

struct SpannedAccess<'de, 's> {
    de: NodeDe<'de, 's>,
    step: u8,
}

impl<'de, 's> de::MapAccess<'de> for SpannedAccess<'de, 's> {
    type Error = DeError;
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, DeError> {
        if self.step >= 3 {
            return Ok(None);
        }
        let key = SPANNED_FIELDS[self.step as usize];
        seed.deserialize(key.into_deserializer()).map(Some)
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let step = self.step;
        self.step += 1;
        match step {
            0 => seed.deserialize((self.de.node.span.start as u64).into_deserializer()),
            1 => seed.deserialize((self.de.node.span.end as u64).into_deserializer()),
            _ => seed.deserialize(self.de),
        }
    }
}

struct Enum<'de, 's> {
    variant: &'de str,
    variant_span: Span,
    body: &'de Body,
    node: &'de Node,
    sink: &'s Sink,
}

impl<'de, 's> de::EnumAccess<'de> for Enum<'de, 's> {
    type Error = DeError;
    type Variant = Self;
    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self), DeError> {
        let v = seed
            .deserialize(de::value::BorrowedStrDeserializer::<DeError>::new(self.variant))
            .map_err(|e| e.at(self.variant_span))?;
        Ok((v, self))
    }
}

impl<'de, 's> de::VariantAccess<'de> for Enum<'de, 's> {
    type Error = DeError;
    fn unit_variant(self) -> Result<(), DeError> {
        match self.body {
            Body::Unit => Ok(()),
            Body::Tuple(t) if t.is_empty() => Ok(()),
            _ => Err(DeError {
                span: Some(self.node.span),
                message: format!("`{}` takes no fields", self.variant),
                suppressed: false,
            }),
        }
    }
    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, DeError> {
        match self.body {
            Body::Tuple(items) if items.len() == 1 => seed.deserialize(NodeDe { node: &items[0], sink: self.sink }),
            _ => Err(DeError {
                span: Some(self.node.span),
                message: format!("expected `{}(value)`", self.variant),
                suppressed: false,
            }),
        }
    }
    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, DeError> {
        match self.body {
            Body::Tuple(items) => visitor.visit_seq(Seq { items: items.iter(), sink: self.sink, tolerant: false }),
            _ => Err(DeError {
                span: Some(self.node.span),
                message: format!("expected `{}(a, b, ...)`", self.variant),
                suppressed: false,
            }),
        }
    }
    fn struct_variant<V: Visitor<'de>>(self, known: &'static [&'static str], visitor: V) -> Result<V::Value, DeError> {
        let fields: &'de [(String, Span, Node)] = match self.body {
            Body::Fields(f) => f,
            Body::Unit => &[],
            Body::Tuple(t) if t.is_empty() => &[],
            Body::Tuple(_) => {
                return Err(DeError {
                    span: Some(self.node.span),
                    message: format!("expected `{}(field: value, ...)`", self.variant),
                    suppressed: false,
                })
            }
        };
        let failed = Cell::new(false);
        let r = visitor.visit_map(Fields {
            fields: fields.iter(),
            known: Some(known),
            value: None,
            sink: self.sink,
            failed: &failed,
        });
        match r {
            Err(_) if failed.get() => Err(DeError::suppressed()),
            r => r.map_err(|e: DeError| e.at(self.node.span)),
        }
    }
}

/// A list that reads on past a bad element (the element's error is already recorded).
#[derive(Clone, Debug, PartialEq)]
pub struct Items<T>(pub Vec<T>);

impl<T> Default for Items<T> {
    fn default() -> Self {
        Items(Vec::new())
    }
}

impl<'de, T: de::Deserialize<'de>> de::Deserialize<'de> for Items<T> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: de::Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Items<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list `[...]`")
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Items<T>, A::Error> {
                let mut out = Vec::new();
                let mut remaining = seq.size_hint().unwrap_or(usize::MAX);
                while remaining > 0 {
                    remaining = remaining.saturating_sub(1);
                    match seq.next_element::<T>() {
                        Ok(Some(v)) => out.push(v),
                        Ok(None) => break,
                        // Recorded by the list; skip the element. (Only this module's
                        // deserializer reports suppressed errors, with an exact size hint.)
                        Err(e) if is_suppressed(&e) => continue,
                        Err(e) => return Err(e),
                    }
                }
                Ok(Items(out))
            }
        }
        d.deserialize_seq(V(PhantomData))
    }
}

/// A map that keeps the file's order and reads on past a bad entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Entries<K, V>(pub Vec<(K, V)>);

impl<K, V> Default for Entries<K, V> {
    fn default() -> Self {
        Entries(Vec::new())
    }
}

impl<'de, K: de::Deserialize<'de>, W: de::Deserialize<'de>> de::Deserialize<'de> for Entries<K, W> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<K, W>(PhantomData<(K, W)>);
        impl<'de, K: de::Deserialize<'de>, W: de::Deserialize<'de>> Visitor<'de> for V<K, W> {
            type Value = Entries<K, W>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map `{...}`")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Entries<K, W>, A::Error> {
                let mut out = Vec::new();
                loop {
                    let k = match map.next_key::<K>() {
                        Ok(Some(k)) => k,
                        Ok(None) => break,
                        Err(e) if is_suppressed(&e) => continue,
                        Err(e) => return Err(e),
                    };
                    match map.next_value::<W>() {
                        Ok(v) => out.push((k, v)),
                        Err(e) if is_suppressed(&e) => continue,
                        Err(e) => return Err(e),
                    }
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(V(PhantomData))
    }
}

/// Whether an error of some deserializer is this module's "already recorded" marker.
fn is_suppressed<E: de::Error>(e: &E) -> bool {
    e.to_string() == SUPPRESSED_TEXT
}

const SUPPRESSED_TEXT: &str = "";

/// A value with the span it was read from.
#[derive(Clone, Debug)]
pub struct Spanned<T> {
    pub span: Span,
    pub value: T,
}

impl<T> Spanned<T> {
    pub fn new(value: T, span: Span) -> Spanned<T> {
        Spanned { span, value }
    }
}

impl<T: PartialEq> PartialEq for Spanned<T> {
    /// Compares values only: where a value was written does not change what it means.
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl<'de, T: de::Deserialize<'de>> de::Deserialize<'de> for Spanned<T> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: de::Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Spanned<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a value")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Spanned<T>, A::Error> {
                let mut start = 0u64;
                let mut end = 0u64;
                let mut value = None;
                while let Some(k) = map.next_key::<String>()? {
                    match k.as_str() {
                        "$start" => start = map.next_value()?,
                        "$end" => end = map.next_value()?,
                        _ => value = Some(map.next_value()?),
                    }
                }
                let value = value.ok_or_else(|| de::Error::custom("a spanned value without its value"))?;
                Ok(Spanned { span: Span::new(start as usize, end as usize), value })
            }
        }
        d.deserialize_struct(SPANNED, SPANNED_FIELDS, V(PhantomData))
    }
}
