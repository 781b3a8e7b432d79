//! The reference attention backend: exact, f64-accumulated, any shape.
