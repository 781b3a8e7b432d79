//! CUDA attention backends; registered always, usable only with the `cuda` feature.
