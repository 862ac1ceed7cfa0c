//! Reading a Chrome-trace JSON file one event at a time: the `[memory]` instant events and the
//! spans (operators, Python functions, annotations) their sites come from are kept, every other
//! event is skipped as it is read, so memory grows with what is kept and never with a count the
//! file claims.
//!
//! Values are read loosely ([`Scalar`]): a field of an unexpected type does not stop the
//! parse, so a bad event can be named, and skipped under `--lenient`. Only broken JSON stops it.

use std::cell::Cell;
use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read};
use std::rc::Rc;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// A JSON value read without caring for its type; arrays and objects are skipped.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) enum Scalar {
    Int(i64),
    Float(f64),
    Str(String),
    /// `null`, a boolean, an array, an object, or an integer past `i64`.
    #[default]
    Other,
}

impl Scalar {
    /// The value as an integer: an integer, or a float that is whole.
    pub(crate) fn as_i64(&self) -> Option<i64> {
        match self {
            Self::Int(i) => Some(*i),
            #[allow(clippy::cast_possible_truncation)]
            Self::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e18 => Some(*f as i64),
            _ => None,
        }
    }

    /// A time in microseconds (Chrome traces' unit) as nanoseconds.
    pub(crate) fn us_as_ns(&self) -> Option<i64> {
        match self {
            Self::Int(i) => i.checked_mul(1000),
            Self::Float(f) if f.is_finite() && f.abs() < 9.0e15 =>
            {
                #[allow(clippy::cast_possible_truncation)]
                Some((f * 1000.0).round() as i64)
            }
            _ => None,
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Int(i) => i.to_string(),
            Self::Float(f) => f.to_string(),
            Self::Str(s) => format!("{:?}", s.chars().take(40).collect::<String>()),
            Self::Other => "null, a boolean, an array, an object or a huge number".to_owned(),
        }
    }
}

impl<'de> de::Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ScalarVisitor)
    }
}

struct ScalarVisitor;

impl<'de> Visitor<'de> for ScalarVisitor {
    type Value = Scalar;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_i64<E>(self, v: i64) -> Result<Scalar, E> {
        Ok(Scalar::Int(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Scalar, E> {
        Ok(i64::try_from(v).map_or(Scalar::Other, Scalar::Int))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Scalar, E> {
        Ok(Scalar::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Scalar, E> {
        Ok(Scalar::Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Scalar, E> {
        Ok(Scalar::Str(v))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Scalar, E> {
        Ok(Scalar::Other)
    }
    fn visit_unit<E>(self) -> Result<Scalar, E> {
        Ok(Scalar::Other)
    }
    fn visit_none<E>(self) -> Result<Scalar, E> {
        Ok(Scalar::Other)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Scalar, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Scalar::Other)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Scalar::Other)
    }
}

/// The keys of an event and of its `args` that are read; every other key is skipped.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Key {
    Ph,
    Cat,
    Name,
    Pid,
    Tid,
    Ts,
    Dur,
    Args,
    DeviceType,
    DeviceId,
    Bytes,
    Addr,
    TotalAllocated,
    TotalReserved,
    Other,
}

impl<'de> de::Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl Visitor<'_> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E>(self, v: &str) -> Result<Key, E> {
        Ok(match v {
            "ph" => Key::Ph,
            "cat" => Key::Cat,
            "name" => Key::Name,
            "pid" => Key::Pid,
            "tid" => Key::Tid,
            "ts" => Key::Ts,
            "dur" => Key::Dur,
            "args" => Key::Args,
            "Device Type" => Key::DeviceType,
            "Device Id" => Key::DeviceId,
            "Bytes" => Key::Bytes,
            "Addr" => Key::Addr,
            "Total Allocated" => Key::TotalAllocated,
            "Total Reserved" => Key::TotalReserved,
            _ => Key::Other,
        })
    }
}

/// The fields of one trace event that are read (all as written; checked by the caller).
#[derive(Debug, Default)]
pub(crate) struct RawEvent {
    /// Not a JSON object.
    pub not_object: bool,
    pub ph: Scalar,
    pub cat: Scalar,
    pub name: Scalar,
    pub pid: Scalar,
    pub tid: Scalar,
    pub ts: Scalar,
    pub dur: Scalar,
    pub args: RawArgs,
}

/// The `args` of a `[memory]` event.
#[derive(Debug, Default)]
pub(crate) struct RawArgs {
    pub device_type: Scalar,
    pub device_id: Scalar,
    pub bytes: Scalar,
    pub addr: Option<Scalar>,
    pub total_allocated: Option<Scalar>,
    pub total_reserved: Option<Scalar>,
}

impl RawEvent {
    pub(crate) fn is_memory(&self) -> bool {
        matches!(&self.name, Scalar::Str(n) if n == "[memory]")
    }

    pub(crate) fn text(s: &Scalar) -> Option<&str> {
        match s {
            Scalar::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Describes a field's value for an error.
    pub(crate) fn found(s: &Scalar) -> String {
        s.describe()
    }
}

impl<'de> de::Deserialize<'de> for RawEvent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(EventVisitor)
    }
}

struct EventVisitor;

impl<'de> Visitor<'de> for EventVisitor {
    type Value = RawEvent;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a trace event")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawEvent, A::Error> {
        let mut e = RawEvent::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Ph => e.ph = map.next_value()?,
                Key::Cat => e.cat = map.next_value()?,
                Key::Name => e.name = map.next_value()?,
                Key::Pid => e.pid = map.next_value()?,
                Key::Tid => e.tid = map.next_value()?,
                Key::Ts => e.ts = map.next_value()?,
                Key::Dur => e.dur = map.next_value()?,
                Key::Args => e.args = map.next_value::<ArgsOrOther>()?.0,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(e)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawEvent, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(not_object())
    }
    fn visit_i64<E>(self, _: i64) -> Result<RawEvent, E> {
        Ok(not_object())
    }
    fn visit_u64<E>(self, _: u64) -> Result<RawEvent, E> {
        Ok(not_object())
    }
    fn visit_f64<E>(self, _: f64) -> Result<RawEvent, E> {
        Ok(not_object())
    }
    fn visit_str<E>(self, _: &str) -> Result<RawEvent, E> {
        Ok(not_object())
    }
    fn visit_bool<E>(self, _: bool) -> Result<RawEvent, E> {
        Ok(not_object())
    }
    fn visit_unit<E>(self) -> Result<RawEvent, E> {
        Ok(not_object())
    }
}

fn not_object() -> RawEvent {
    RawEvent {
        not_object: true,
        ..RawEvent::default()
    }
}

/// `args`, or defaults when it is not an object.
struct ArgsOrOther(RawArgs);

impl<'de> de::Deserialize<'de> for ArgsOrOther {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ArgsVisitor)
    }
}

struct ArgsVisitor;

impl<'de> Visitor<'de> for ArgsVisitor {
    type Value = ArgsOrOther;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object of arguments")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ArgsOrOther, A::Error> {
        let mut a = RawArgs::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::DeviceType => a.device_type = map.next_value()?,
                Key::DeviceId => a.device_id = map.next_value()?,
                Key::Bytes => a.bytes = map.next_value()?,
                Key::Addr => a.addr = Some(map.next_value()?),
                Key::TotalAllocated => a.total_allocated = Some(map.next_value()?),
                Key::TotalReserved => a.total_reserved = Some(map.next_value()?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(ArgsOrOther(a))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<ArgsOrOther, A::Error> {
        ScalarVisitor.visit_seq(seq)?;
        Ok(ArgsOrOther(RawArgs::default()))
    }
    fn visit_i64<E>(self, _: i64) -> Result<ArgsOrOther, E> {
        Ok(ArgsOrOther(RawArgs::default()))
    }
    fn visit_u64<E>(self, _: u64) -> Result<ArgsOrOther, E> {
        Ok(ArgsOrOther(RawArgs::default()))
    }
    fn visit_f64<E>(self, _: f64) -> Result<ArgsOrOther, E> {
        Ok(ArgsOrOther(RawArgs::default()))
    }
    fn visit_str<E>(self, _: &str) -> Result<ArgsOrOther, E> {
        Ok(ArgsOrOther(RawArgs::default()))
    }
    fn visit_bool<E>(self, _: bool) -> Result<ArgsOrOther, E> {
        Ok(ArgsOrOther(RawArgs::default()))
    }
    fn visit_unit<E>(self) -> Result<ArgsOrOther, E> {
        Ok(ArgsOrOther(RawArgs::default()))
    }
}

/// Receives each event as it is read, with the decompressed byte offset just past it; an
/// `Err` stops the parse (a strict load's first bad event).
pub(crate) trait EventSink {
    fn event(&mut self, index: u64, end_offset: u64, event: RawEvent) -> Result<(), String>;
}

/// How a parse ended.
pub(crate) struct Parsed {
    /// The file had a `traceEvents` array (or was an array of events).
    pub has_events: bool,
    /// Events read.
    pub events: u64,
}

/// Why a parse stopped early.
pub(crate) enum ParseStop {
    /// Broken JSON (or the compressed stream failing) at `offset` of the decompressed text.
    Syntax {
        offset: u64,
        line: usize,
        column: usize,
        message: String,
        /// The text ended before the JSON did.
        eof: bool,
        parsed: Parsed,
    },
    /// The sink refused an event.
    Sink(String),
}

/// Counts the bytes the JSON parser takes (it reads byte by byte, peeking one ahead), so an
/// event or an error can name its offset.
struct Counted<R> {
    inner: R,
    read_bytes: Rc<Cell<u64>>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read_bytes.set(self.read_bytes.get() + n as u64);
        Ok(n)
    }
}

/// Parses the trace in `reader`, handing every event to `sink`.
pub(crate) fn parse<R: Read>(reader: R, sink: &mut dyn EventSink) -> Result<Parsed, ParseStop> {
    let read_bytes = Rc::new(Cell::new(0));
    let mut counted = Counted {
        inner: reader,
        read_bytes: Rc::clone(&read_bytes),
    };
    let mut state = State {
        sink,
        read_bytes: Rc::clone(&read_bytes),
        events: 0,
        has_events: false,
        refused: None,
    };
    let result = {
        let mut de = serde_json::Deserializer::from_reader(&mut counted);
        let r = TopSeed(&mut state).deserialize(&mut de);
        r.and_then(|()| de.end())
    };
    let parsed = Parsed {
        has_events: state.has_events,
        events: state.events,
    };
    if let Some(why) = state.refused {
        return Err(ParseStop::Sink(why));
    }
    match result {
        Ok(()) => Ok(parsed),
        Err(e) => Err(ParseStop::Syntax {
            offset: read_bytes.get(),
            line: e.line(),
            column: e.column(),
            eof: e.is_eof() || e.is_io(),
            message: e.to_string(),
            parsed,
        }),
    }
}

struct State<'s> {
    sink: &'s mut dyn EventSink,
    /// Bytes the parser has taken.
    read_bytes: Rc<Cell<u64>>,
    events: u64,
    has_events: bool,
    refused: Option<String>,
}

/// The whole file: an object with `traceEvents`, or the array form of a Chrome trace.
struct TopSeed<'a, 's>(&'a mut State<'s>);

impl<'de> DeserializeSeed<'de> for TopSeed<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(TopVisitor(self.0))
    }
}

struct TopVisitor<'a, 's>(&'a mut State<'s>);

impl<'de> Visitor<'de> for TopVisitor<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object with traceEvents")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<TopKey>()? {
            if key == TopKey::TraceEvents && !self.0.has_events {
                map.next_value_seed(EventsSeed(self.0))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        EventsVisitor(self.0).visit_seq(seq)
    }
}

#[derive(PartialEq, Eq)]
enum TopKey {
    TraceEvents,
    Other,
}

impl<'de> de::Deserialize<'de> for TopKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = TopKey;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E>(self, v: &str) -> Result<TopKey, E> {
                Ok(if v == "traceEvents" {
                    TopKey::TraceEvents
                } else {
                    TopKey::Other
                })
            }
        }
        d.deserialize_str(V)
    }
}

struct EventsSeed<'a, 's>(&'a mut State<'s>);

impl<'de> DeserializeSeed<'de> for EventsSeed<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(EventsVisitor(self.0))
    }
}

struct EventsVisitor<'a, 's>(&'a mut State<'s>);

impl<'de> Visitor<'de> for EventsVisitor<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of trace events")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.0.has_events = true;
        while let Some(event) = seq.next_element::<RawEvent>()? {
            let index = self.0.events;
            self.0.events += 1;
            if let Err(why) = self.0.sink.event(index, self.0.read_bytes.get(), event) {
                self.0.refused = Some(why);
                return Err(de::Error::custom("refused"));
            }
        }
        Ok(())
    }
}

/// Interns strings (operator and function names repeat thousands of times).
#[derive(Default)]
pub(crate) struct Names {
    ids: HashMap<String, u32>,
    pub names: Vec<String>,
}

impl Names {
    pub(crate) fn intern(&mut self, s: String) -> u32 {
        if let Some(&id) = self.ids.get(&s) {
            return id;
        }
        let id = u32::try_from(self.names.len()).unwrap_or(u32::MAX);
        self.names.push(s.clone());
        self.ids.insert(s, id);
        id
    }
}
