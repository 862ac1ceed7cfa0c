//! Loaders.
