//! Replay of the `bfc` policy against a TensorFlow memory log (in progress).
