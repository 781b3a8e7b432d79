//! Linking this one crate registers every backend.

use pagoda_backends as _;

#[test]
fn every_linked_backend_crate_registers_something() {
    let regs = pagoda_core::attention::registered_modules();
    for krate in pagoda_backends::LINKED_CRATES {
        assert!(
            regs.iter()
                .any(|(module, _)| module == krate || module.starts_with(&format!("{krate}::"))),
            "`{krate}` is a dependency of pagoda-backends but registered no backend: {:?}",
            regs.iter().map(|(m, r)| (m, r.name)).collect::<Vec<_>>()
        );
    }
    assert!(pagoda_backends::LINKED_CRATES.len() >= 5);
    let names: Vec<&str> = pagoda_core::registered_backends()
        .iter()
        .map(|r| r.name)
        .collect();
    for name in [
        "naive",
        "paged",
        "flash",
        "cuda-naive",
        "cuda-paged",
        "cuda-flash",
        "example",
    ] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
}
