//! The internal error the allocator models (`bfc`, `glibc`) share: one of their structures is
//! inconsistent (a bug in the model, never a user error). An allocation that meets it is refused
//! as unsupported, naming the model, so the replay reports it instead of stopping.

use crate::heap::AllocError;

/// An internal structure of `model` is inconsistent: `what`.
#[derive(Debug)]
pub(crate) struct Broken {
    /// How the model calls itself in the message ("bfc", "glibc model").
    pub(crate) model: &'static str,
    pub(crate) what: &'static str,
}

impl From<Broken> for AllocError {
    fn from(b: Broken) -> Self {
        Self::Unsupported(format!("{} internal error: {}", b.model, b.what))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_model() {
        let e = AllocError::from(Broken {
            model: "bfc",
            what: "merge: bad handle",
        });
        assert_eq!(
            e,
            AllocError::Unsupported("bfc internal error: merge: bad handle".to_owned())
        );
    }
}
