//! The conformance kit: one macro runs the whole backend suite against the naive reference.
