//! pprof's `profile.proto` (gzipped or not), as Go's runtime, JAX's device memory profiler and
//! jemalloc's pprof writers produce it.
//!
//! Sample types are read by name: `inuse_space`/`inuse_objects` are what is live at the
//! profile's moment, `alloc_space`/`alloc_objects` what was allocated up to it (Go's heap
//! convention); JAX's `space`/`allocations` are its live device buffers. A profile with none
//! of these names has its first type in bytes read as live bytes, and says so. Values are
//! taken as written: pprof's values are already scaled for sampling. A location's lines are
//! frames, innermost first (its inlined calls, then the function they were inlined into); a
//! location without lines (an unsymbolized profile) is one frame named after its module and
//! address. Samples of one stack (told apart by labels) are summed.

use std::collections::HashMap;

use super::proto::{Reader, Value};
use super::{HeapProfile, Holds, ProfileFormat, ProfileSample};
use crate::sites::{Frame, StackTable};

/// Whether `head` (a file's first decompressed bytes) is the start of a `Profile` message:
/// every field in it is a field of `Profile` with its schema's wire type, up to the end of
/// the head (where the last field may be cut). Text can pass for a few fields (a digit is a
/// key of field 6 and a `.` a length): the whole head must read.
#[must_use]
pub fn is_pprof(head: &[u8]) -> bool {
    let mut r = Reader::new(head, 0);
    let mut fields = 0;
    loop {
        match r.field() {
            Ok(Some((n, v, _))) => {
                let ok = match n {
                    1..=6 | 11 => matches!(v, Value::Bytes(_)),
                    7..=10 | 12 | 14 => matches!(v, Value::Varint(_)),
                    13 => matches!(v, Value::Varint(_) | Value::Bytes(_)),
                    _ => false,
                };
                if !ok {
                    return false;
                }
                fields += 1;
            }
            Ok(None) => break,
            // The head may cut its last field; any other error is not a profile.
            Err(e) if e.contains("runs past the end") || e.contains("cut at byte") => break,
            Err(_) => return false,
        }
    }
    fields >= 2
}

/// A location: its mapping, address and lines (function id, line).
struct Location {
    mapping: u64,
    address: u64,
    lines: Vec<(u64, i64)>,
}

/// The top-level fields, borrowed.
#[derive(Default)]
struct Parts<'a> {
    sample_types: Vec<&'a [u8]>,
    samples: Vec<(&'a [u8], usize)>,
    mappings: Vec<(&'a [u8], usize)>,
    locations: Vec<(&'a [u8], usize)>,
    functions: Vec<(&'a [u8], usize)>,
    strings: Vec<String>,
    duration_ns: Option<u64>,
}

/// The top-level fields; with `lenient`, those before a field that does not read (the reason
/// then in `damage`).
fn parts<'a>(
    bytes: &'a [u8],
    lenient: bool,
    damage: &mut Option<String>,
) -> Result<Parts<'a>, String> {
    let mut p = Parts::default();
    let mut r = Reader::new(bytes, 0);
    loop {
        let (n, v, at) = match r.field() {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) if lenient => {
                *damage = Some(e);
                break;
            }
            Err(e) => return Err(e),
        };
        match (n, v) {
            (1, Value::Bytes(b)) => p.sample_types.push(b),
            (2, Value::Bytes(b)) => p.samples.push((b, at)),
            (3, Value::Bytes(b)) => p.mappings.push((b, at)),
            (4, Value::Bytes(b)) => p.locations.push((b, at)),
            (5, Value::Bytes(b)) => p.functions.push((b, at)),
            (6, Value::Bytes(b)) => p.strings.push(String::from_utf8_lossy(b).into_owned()),
            (10, v) => p.duration_ns = v.uint(),
            _ => {}
        }
    }
    Ok(p)
}

/// The message at `at` as (field, value) pairs.
fn fields(b: &[u8], at: usize) -> Result<Vec<(u32, Value<'_>)>, String> {
    let mut r = Reader::new(b, at);
    let mut out = Vec::new();
    while let Some((n, v, _)) = r.field()? {
        out.push((n, v));
    }
    Ok(out)
}

/// Parses a whole profile.
///
/// # Errors
/// A message that does not read, naming its byte offset (in the decompressed bytes); a
/// profile with no sample type in bytes.
pub fn parse(bytes: &[u8], lenient: bool) -> Result<HeapProfile, String> {
    let mut damage = None;
    let p = parts(bytes, lenient, &mut damage)?;
    let string = |i: u64| -> &str {
        usize::try_from(i)
            .ok()
            .and_then(|i| p.strings.get(i))
            .map_or("", String::as_str)
    };
    // Which value index holds which figure.
    let mut types: Vec<(String, String)> = Vec::new();
    for b in &p.sample_types {
        let (mut kind, mut unit) = (0, 0);
        for (n, v) in fields(b, 0)? {
            match n {
                1 => kind = v.uint().unwrap_or(0),
                2 => unit = v.uint().unwrap_or(0),
                _ => {}
            }
        }
        types.push((string(kind).to_owned(), string(unit).to_owned()));
    }
    let find = |names: &[&str]| types.iter().position(|(k, _)| names.contains(&k.as_str()));
    let mut notes = Vec::new();
    let mut live_bytes = find(&["inuse_space", "space"]);
    if live_bytes.is_none() {
        live_bytes = types.iter().position(|(_, u)| u == "bytes");
        if let Some(i) = live_bytes {
            notes.push(format!(
                "the profile's sample type {:?} is read as the live bytes (it has no inuse_space)",
                types.get(i).map_or("", |t| t.0.as_str())
            ));
        }
    }
    let Some(live_bytes) = live_bytes else {
        return Err(format!(
            "no sample type in bytes (the profile has {}): not a heap profile",
            types
                .iter()
                .map(|(k, u)| format!("{k}/{u}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    };
    let index = Index {
        live_bytes,
        live_objects: find(&["inuse_objects", "allocations"]),
        alloc_bytes: find(&["alloc_space"]),
        alloc_objects: find(&["alloc_objects"]),
    };
    let code = Code::read(&p, &string)?;
    let mut stacks = StackTable::new();
    let mut frames_of_location: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut by_stack: HashMap<u32, usize> = HashMap::new();
    let mut samples: Vec<ProfileSample> = Vec::new();
    let mut skipped = 0u64;
    for (b, at) in &p.samples {
        let (locations, values) = match sample_fields(b, *at) {
            Ok(lv) => lv,
            Err(_) if lenient => {
                skipped += 1;
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut frame_ids = Vec::new();
        for loc in locations {
            let ids = frames_of_location.entry(loc).or_insert_with(|| {
                code.frames(loc)
                    .into_iter()
                    .map(|f| stacks.intern_frame(f))
                    .collect()
            });
            frame_ids.extend_from_slice(ids);
        }
        let stack = stacks.intern_stack(frame_ids);
        let s = *by_stack.entry(stack).or_insert_with(|| {
            samples.push(ProfileSample {
                stack,
                ..ProfileSample::default()
            });
            samples.len() - 1
        });
        if let Some(sample) = samples.get_mut(s) {
            index.add(sample, &values);
        }
    }
    if let Some(e) = damage {
        notes.push(format!(
            "the profile is damaged ({e}): read what came before (--lenient)"
        ));
    }
    if skipped > 0 {
        notes.push(format!(
            "skipped {skipped} samples that did not read (--lenient)"
        ));
    }
    notes.push(format!(
        "a pprof heap profile: a moment, not a timeline (sample types {})",
        types
            .iter()
            .map(|(k, u)| format!("{k}/{u}"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    Ok(HeapProfile {
        format: ProfileFormat::Pprof,
        stacks,
        samples,
        has: Holds {
            live: true,
            alloc: index.alloc_bytes.is_some(),
            peak: false,
        },
        duration_ns: p.duration_ns,
        notes,
    })
}

/// A sample's location ids and values.
fn sample_fields(b: &[u8], at: usize) -> Result<(Vec<u64>, Vec<u64>), String> {
    let (mut locations, mut values) = (Vec::new(), Vec::new());
    for (n, v) in fields(b, at)? {
        match n {
            1 => locations.extend(v.uints()?),
            2 => values.extend(v.uints()?),
            _ => {}
        }
    }
    Ok((locations, values))
}

/// Which value of a sample is which figure.
struct Index {
    live_bytes: usize,
    live_objects: Option<usize>,
    alloc_bytes: Option<usize>,
    alloc_objects: Option<usize>,
}

impl Index {
    fn add(&self, s: &mut ProfileSample, values: &[u64]) {
        // pprof's values are int64: a negative one (written as a huge varint) counts as none.
        let get = |i: Option<usize>| {
            i.and_then(|i| values.get(i))
                .copied()
                .filter(|&v| i64::try_from(v).is_ok())
                .unwrap_or(0)
        };
        s.live_bytes = s.live_bytes.saturating_add(get(Some(self.live_bytes)));
        s.live_objects = s.live_objects.saturating_add(get(self.live_objects));
        s.alloc_bytes = s.alloc_bytes.saturating_add(get(self.alloc_bytes));
        s.alloc_objects = s.alloc_objects.saturating_add(get(self.alloc_objects));
    }
}

/// The profile's functions, mappings and locations, by id.
struct Code {
    functions: HashMap<u64, (String, String)>,
    mappings: HashMap<u64, String>,
    locations: HashMap<u64, Location>,
}

impl Code {
    fn read<'s>(p: &'s Parts<'_>, string: &dyn Fn(u64) -> &'s str) -> Result<Self, String> {
        let mut functions = HashMap::new();
        for (b, at) in &p.functions {
            let (mut id, mut name, mut file) = (0, 0, 0);
            for (n, v) in fields(b, *at)? {
                match n {
                    1 => id = v.uint().unwrap_or(0),
                    2 => name = v.uint().unwrap_or(0),
                    4 => file = v.uint().unwrap_or(0),
                    _ => {}
                }
            }
            functions.insert(id, (string(name).to_owned(), string(file).to_owned()));
        }
        let mut mappings = HashMap::new();
        for (b, at) in &p.mappings {
            let (mut id, mut file) = (0, 0);
            for (n, v) in fields(b, *at)? {
                match n {
                    1 => id = v.uint().unwrap_or(0),
                    5 => file = v.uint().unwrap_or(0),
                    _ => {}
                }
            }
            mappings.insert(id, string(file).to_owned());
        }
        let mut locations = HashMap::new();
        for (b, at) in &p.locations {
            let mut id = 0;
            let mut loc = Location {
                mapping: 0,
                address: 0,
                lines: Vec::new(),
            };
            for (n, v) in fields(b, *at)? {
                match (n, v) {
                    (1, v) => id = v.uint().unwrap_or(0),
                    (2, v) => loc.mapping = v.uint().unwrap_or(0),
                    (3, v) => loc.address = v.uint().unwrap_or(0),
                    (4, Value::Bytes(line)) => {
                        let (mut f, mut l) = (0, 0i64);
                        for (n, v) in fields(line, *at)? {
                            match n {
                                1 => f = v.uint().unwrap_or(0),
                                2 => l = v.uint().map_or(0, |x| x as i64),
                                _ => {}
                            }
                        }
                        loc.lines.push((f, l));
                    }
                    _ => {}
                }
            }
            locations.insert(id, loc);
        }
        Ok(Self {
            functions,
            mappings,
            locations,
        })
    }

    /// The frames of location `id`, innermost first.
    fn frames(&self, id: u64) -> Vec<Frame> {
        let Some(loc) = self.locations.get(&id) else {
            return vec![Frame {
                function: format!("location {id}"),
                file: "??".to_owned(),
                line: 0,
                module: String::new(),
            }];
        };
        let module = self.mappings.get(&loc.mapping).cloned().unwrap_or_default();
        if loc.lines.is_empty() {
            let name = module.rsplit('/').next().unwrap_or("");
            let function = if name.is_empty() {
                format!("0x{:x}", loc.address)
            } else {
                format!("{name}+0x{:x}", loc.address)
            };
            return vec![Frame {
                function,
                file: "??".to_owned(),
                line: 0,
                module,
            }];
        }
        loc.lines
            .iter()
            .map(|(f, line)| {
                let (name, file) = self.functions.get(f).cloned().unwrap_or_default();
                Frame {
                    function: if name.is_empty() {
                        format!("function {f}")
                    } else {
                        name
                    },
                    file: if file.is_empty() {
                        "??".to_owned()
                    } else {
                        file
                    },
                    line: (*line).max(0),
                    module: module.clone(),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_trace_is_not_taken_for_a_profile() {
        // The head of a real libtracemalloc trace: its first bytes read as two fields of
        // `Profile` (`2` is field 6's key, `.` a length); the third does not.
        let text = b"2.588836\t140719197803072\t1094\t0x55f8341077e0\n2.588836\t140719197803072\t-1\t0x55f8341077e0\n2.588837\t140719197803072\t1094\t0x55f8341077e0\n";
        assert!(!is_pprof(text));
    }
}
