//! Which requests of a trace recorded in a CPython interpreter a reader sees.
//!
//! There, the tracer records each allocation twice over where Python's allocator stands
//! between the program and the C library: once as the request the program made of Python's
//! allocator (`PyObject_Malloc`, `PyMem_Malloc`...: the *object* a function holds), and once
//! as what that allocator asked of the C library for it, or the 256 KiB / 1 MiB arena pymalloc
//! mapped to carve small objects from. Which of these an event is sits in bits 60-61 of its
//! recorded address (user addresses stay below 2^57): 0 for the C library called by the
//! program itself, 1 an object request, 2 a C library call made by Python's allocator, 3 an
//! arena (see the tracer's `python/mod.rs`). A trace recorded elsewhere has only 0.
//!
//! A reader takes one of two views, each a consistent heap of unique addresses:
//! [`Requests::Objects`], what the program asked for (0 and 1: a function's objects are its
//! own, as `tracemalloc` counts them), and [`Requests::Libc`], what reached the C library (0,
//! 2 and 3: the bytes the process held, arenas included, which is what a policy replaying the
//! trace must place). Binary records go through [`Requests::view`] before they are paired.

/// Bits 60-61 of a recorded address: the allocator that served the event.
const TAG_SHIFT: u32 = 60;
const TAG_MASK: u64 = 3 << TAG_SHIFT;

/// See the module documentation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Requests {
    /// The requests the program made: the C library's calls it made itself, and its requests
    /// to Python's allocator.
    #[default]
    Objects,
    /// What reached the C library: the program's own calls, those Python's allocator made,
    /// and pymalloc's arenas.
    Libc,
}

impl Requests {
    /// The address `addr` has in this view (its tag cleared), or `None` when the event
    /// belongs to the other view only.
    #[inline(always)]
    #[must_use]
    pub fn view(self, addr: u64) -> Option<u64> {
        let tag = (addr & TAG_MASK) >> TAG_SHIFT;
        let keep = match self {
            Self::Objects => tag <= 1,
            Self::Libc => tag != 1,
        };
        keep.then_some(addr & !TAG_MASK)
    }

    /// Whether the event at `addr` came through Python's allocator (any tag).
    #[inline(always)]
    #[must_use]
    pub fn is_python(addr: u64) -> bool {
        addr & TAG_MASK != 0
    }

    /// The name the command line takes.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Objects => "objects",
            Self::Libc => "libc",
        }
    }

    /// What the view holds, for a note to the user.
    #[must_use]
    pub fn describe(self) -> &'static str {
        match self {
            Self::Objects => {
                "the requests the program made (Python's objects as it asked for them, pymalloc's \
                 included)"
            }
            Self::Libc => {
                "what reached the C library (pymalloc's arenas and the blocks Python's allocator \
                 asked for, not its objects)"
            }
        }
    }
}

impl std::str::FromStr for Requests {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "objects" => Ok(Self::Objects),
            "libc" => Ok(Self::Libc),
            _ => Err(format!("`{s}`: expected `objects` or `libc`")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_view_keeps_the_programs_own_calls_and_its_side_of_pythons_allocator() {
        let a = 0x7f00_0000_1000u64;
        let tagged = |t: u64| a | t << TAG_SHIFT;
        assert_eq!(Requests::Objects.view(a), Some(a));
        assert_eq!(Requests::Libc.view(a), Some(a));
        assert_eq!(Requests::Objects.view(tagged(1)), Some(a));
        assert_eq!(Requests::Libc.view(tagged(1)), None);
        for t in [2, 3] {
            assert_eq!(Requests::Objects.view(tagged(t)), None);
            assert_eq!(Requests::Libc.view(tagged(t)), Some(a));
        }
        assert!(!Requests::is_python(a) && Requests::is_python(tagged(3)));
        assert_eq!("libc".parse(), Ok(Requests::Libc));
        assert!("arenas".parse::<Requests>().is_err());
    }
}
