//! End-to-end tests on the real model.
